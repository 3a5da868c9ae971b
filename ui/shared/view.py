"""A run on view, as the page shows it wherever it shows one (the run section streaming it; a
branch, an undo or the saved work putting it on view again): the generated text with its
popovers, the tokenization view, the status and context lines, the run's statistics. Pure
functions of the engine's EngineInfo and a run's record."""

from __future__ import annotations

import html
import math
import unicodedata
from dataclasses import dataclass

from inference.device import dtype_name
from inference.model.anatomy import decode_cost
from inference.loading.byte_pieces import byte_hint, completed_label
from ui.format import (BUCKETS, binary_size, bucket, bucket_class, chosen_prob_html, count, ended_markdown, fmt_p,
                       ordinal, prob_html, reason_text, shown_prob, si, token_html, token_label, visible)
from ui.glossary import gloss
from ui.run_state import RunRecord
from ui.shared import cost as constraint_cost


@dataclass
class Chip:
    """One piece of the generated text as the page shows it: a token, or the byte tokens that
    make one character together."""
    text: str
    prob: float | None  # the probability the chip was sampled with: the product over its tokens
    steps: range  # the steps it spans
    cut: bool = False  # a character the end of the run cut off
    raw: float | None = None  # its probability in the model's raw distribution (the product likewise)


def output_chips(rec: RunRecord, tokenizer) -> list[Chip]:
    chips = []
    for steps, complete in tokenizer.char_groups([s.token_id for s in rec.steps]):
        group = [rec.steps[i] for i in steps]
        text = "".join(s.text for s in group)
        if not complete:
            held = "".join(s.piece for s in group)
            text = f"{text}[cut off: {held}]" if rec.done is not None else text
        probs, raws = [shown_prob(s) for s in group], [s.raw_prob for s in group]
        chips.append(Chip(text, None if None in probs else math.prod(probs), steps, not complete,
                          None if None in raws else math.prod(raws)))
    return chips


def highlighted_output(rec: RunRecord, tokenizer) -> list[tuple[str, str | None]]:
    """One (text, bucket) entry per chip; output_chips maps a click's index to its steps."""
    chips = output_chips(rec, tokenizer)
    out = [(c.text, bucket(c.prob)) for c in chips]
    tail = rec.done.tail if rec.done else ""
    if tail:
        out.append((tail, None))
    return out


def _shown(text: str) -> str:
    """Generated text as HTML that shows every newline (a visible ↵, then the line break: the
    output is white-space: pre-wrap) and every character that would print as nothing (a
    control or format character: ⟨U+0004⟩), so that each token has something to see and click."""
    if text.replace("\n", "").replace("\t", "").isprintable():  # most text: no character to look at
        return html.escape(text).replace("\n", "↵\n")
    return "".join(f"<span class='tl-cc'>⟨U+{ord(ch):04X}⟩</span>"
                   if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf") else html.escape(ch)
                   for ch in text).replace("\n", "↵\n")


def chip_class(c: Chip) -> str:
    """A chip's colour classes: by the probability it was sampled with (tl-b*), and by the
    model's raw probability (tl-rb*), which the page shows instead when "Colour by" says raw."""
    return f"tl-t {bucket_class(c.prob)} tl-rb{bucket_class(c.raw)[4:]}"


def legend_html() -> str:
    """What the output's colours mean; only shown under output that has them (output_html)."""
    return ("<div class='tl-legend'><span class='tl-by-final'>colour = probability the token was sampled "
            "with (final):</span><span class='tl-by-raw'>colour = the model's raw probability:</span> "
            + "".join(f"<span class='tl-key {bucket_class(t)}'>{html.escape(name)}</span>" for t, name in BUCKETS)
            + "</div>")


def _popover(rec: RunRecord, chip: "Chip", tokenizer) -> str:
    """What hovering (or tapping) a generated token shows: its step, probabilities and the top
    alternatives the model had there."""
    first = rec.steps[chip.steps[0]]
    shown = first.top[:5]
    if all(c.id != first.token_id for c in shown):  # a sampled token further down: listed too, last
        shown = shown + [c for c in first.top if c.id == first.token_id]
    rows = "<span class='tl-pop-cols'><span>token</span><span>raw</span><span>final</span></span>" + "".join(
        f"<span class='tl-alt{' tl-alt-chosen' if c.id == first.token_id else ''}'>"
        f"<span>{token_html(c.piece)}</span><span>{prob_html(c.raw_prob)}</span>"
        f"<span>{prob_html(c.prob)}</span></span>"
        for c in shown)
    span = f"steps {chip.steps[0]}–{chip.steps[-1]}" if len(chip.steps) > 1 else f"step {chip.steps[0]}"
    pieces = [rec.steps[i].piece for i in chip.steps]
    if chip.cut:  # bytes of a character the run's end cut off
        char = f"<span class='tl-pop-char'>{html.escape(''.join(pieces))}: the run ended before the character did</span>"
    elif len(chip.steps) > 1 or byte_hint(first.piece):  # byte tokens the run finished as a character
        char = f"<span class='tl-pop-char'>{html.escape(completed_label(pieces, visible(chip.text)))}</span>"
    else:
        char = ""
    return (f"<span class='tl-pop' role='tooltip'>{char}<span class='tl-pop-head'>{span} · id {first.token_id} · "
            f"{chosen_prob_html(first.prob, first.raw_prob)}</span><span class='tl-pop-rows3'>{rows}</span></span>")


def output_html(rec: RunRecord | None, tokenizer, detail: bool | None = None, empty: str = "") -> str:
    """The generated text as the page shows it: one span per chip, coloured by its probability,
    newlines visible; data-i is the chip's index (a click selects its step). With detail (by
    default once the run has ended) each chip carries a popover with the top alternatives;
    while streaming only its probability, in the title, to keep updates small."""
    if rec is None or (not rec.steps and rec.done is None):
        return f"<div class='tl-out tl-empty'>{html.escape(empty or 'Generate to see the output here.')}</div>"
    detail = rec.done is not None if detail is None else detail
    chips = output_chips(rec, tokenizer)
    parts = []
    for i, c in enumerate(chips):
        if detail:
            parts.append(f"<span class='{chip_class(c)}' data-i='{i}' tabindex='0'>"
                         f"{_shown(c.text) or '∅'}{_popover(rec, c, tokenizer)}</span>")
        else:
            parts.append(f"<span class='{chip_class(c)}' data-i='{i}' title='p {fmt_p(c.prob)}, raw p {fmt_p(c.raw)}'>"
                         f"{_shown(c.text) or '∅'}</span>")
    tail = rec.done.tail if rec.done else ""
    if tail:
        parts.append(f"<span class='tl-tail' title='text held back until the end'>{_shown(tail)}</span>")
    if rec.given:  # a branch: the tokens it continued after, as given
        parts.insert(0, f"<span class='tl-given' title='given: the {count(len(rec.given), 'token')} this branch "
                        f"continued after'>{_shown(rec.given_text)}</span>")
    text = rec.answer_text
    # No legend under a run that ended without a coloured token: there is nothing for it to explain.
    return (f"<div class='tl-out' data-text='{html.escape(text, quote=True)}'>{''.join(parts)}</div>"
            + (legend_html() if chips else ""))


def output_tokens(rec: RunRecord | None, tokenizer) -> list[dict]:
    """The generated text for API clients: one entry per chip (text, probability, first step)."""
    if rec is None:
        return []
    out = [{"token": c.text, "prob": c.prob, "step": c.steps[0]} for c in output_chips(rec, tokenizer)]
    tail = rec.done.tail if rec.done else ""
    if tail:  # text held back until the end: no step of its own
        out.append({"token": tail, "prob": None, "step": None})
    return out


def _token_chips(tokenizer, ids: list[int]) -> str:
    chips = []
    for positions, complete in tokenizer.char_groups(ids):
        group = [ids[i] for i in positions]
        tokens = "".join(f"<span class='tl-tk{' tl-ctl' if tokenizer.is_control(i) else ''}'>"
                         f"{html.escape(token_label(tokenizer.piece(i)))}<sub>{i}</sub></span>" for i in group)
        if len(group) == 1:
            chips.append(f"<span class='tl-chip'>{tokens}</span>")
        else:
            char = tokenizer.decode(group) if complete else "[cut off]"
            chips.append(f"<span class='tl-chip tl-char'><span class='tl-c'>{html.escape(visible(char))}"
                         f"</span><span class='tl-bytes'>{tokens}</span></span>")
    return "".join(chips)


def run_tokens_html(tokenizer, prompt_ids: list[int], generated_ids: list[int] | None = None,
                    fed: bool = True, given_ids: list[int] = ()) -> str:
    """The tokenization view: the prompt's tokens, a branch's (or an edit's) given tokens apart
    (the run read them after the prompt), and once there are any the generated ones.
    fed: the prompt of a run (else the prompt as the next run will feed it, before any run)."""
    out = prompt_tokens_html(tokenizer, prompt_ids, "Prompt of the run" if fed else "Prompt as it will be fed")
    for cls, title, ids in ((" tl-given-tokens", "Given (read after the prompt)", given_ids),
                            ("", "Generated", generated_ids)):
        if ids:
            out += (f"<div class='tl-tokens tl-gen-tokens{cls}'><div class='tl-title'>{title}: {count(len(ids), 'token')}"
                    f"</div><div class='tl-chips'>{_token_chips(tokenizer, ids)}</div></div>")
    return out


def fed_text(tokenizer, rec: RunRecord) -> str:
    """"Prompt as fed to the model": the run's text with the start-of-text token the tokenizer
    put before it (Gemma's <bos>), as the tokens below list it."""
    text = rec.prompt_text
    bos = tokenizer.bos_token
    if rec.prompt_ids and rec.prompt_ids[0] == tokenizer.bos_id and bos and not text.startswith(bos):
        text = bos + text
    return text


def prompt_tokens_html(tokenizer, ids: list[int], title: str = "Prompt") -> str:
    """The prompt's tokens as chips: one per token, and one per character made of byte tokens
    with those tokens beneath it; control tokens marked."""
    control = sum(tokenizer.is_control(i) for i in ids)
    return (f"<div class='tl-tokens'><div class='tl-title'>{html.escape(title)}: {count(len(ids), 'token')}"
            + (f", {control:,} of them {'a control token' if control == 1 else 'control tokens'} (outlined)"
               if control else "")
            + f"</div><div class='tl-chips'>{_token_chips(tokenizer, ids)}</div></div>")


def downloads_html(run_url: str | None, settings_url: str | None) -> str:
    """Links to a run's downloads (addresses relative to the page), or a note before any run."""
    if not run_url:
        return "<div class='tl-downloads tl-empty'>Downloads of the run's steps and settings come with its end.</div>"
    return (f"<div class='tl-downloads'><a class='tl-dl' id='download-run' href='{html.escape(run_url, quote=True)}' "
            f"download>Download run (JSONL)</a><a class='tl-dl' id='download-settings' "
            f"href='{html.escape(settings_url, quote=True)}' download>Download settings (JSON)</a></div>")


def context_text(n_prompt: int, n_generated: int | None, max_new: int | None, context: int, n_given: int = 0) -> str:
    """The context counter: prompt + given (a branch's or an edit's ids) + generated (or the
    most that may be) / the context window."""
    given = f" + **{n_given:,}** given" if n_given else ""
    if n_generated is None:
        room = context - n_prompt - n_given
        most = min(max_new or 0, room)
        return (f"Context: **{n_prompt:,}** prompt {'token' if n_prompt == 1 else 'tokens'}{given} + up to {most:,} new = {n_prompt + n_given + most:,} "
                f"of {context:,}" + (f" (max new tokens will be lowered to {room:,})" if max_new and max_new > room else "")
                + (" · the given ids continue a branch (More settings); a new prompt drops them" if n_given else ""))
    return (f"Context: **{n_prompt:,}** prompt{given} + **{n_generated:,}** generated = "
            f"{n_prompt + n_given + n_generated:,} of {context:,}")


def status_text(rec: RunRecord | None, context: int, now: float, ahead: tuple[int, int] | None = None) -> str:
    """One line on where the run is: waiting for the engine (with what is ahead and for how
    long), prefill of a long prompt, generating, or ended."""
    if rec is None:
        return ""
    n = len(rec.prompt_ids)
    if rec.started_at is None:  # clicked, not yet taken by the engine
        waited = now - rec.queued_at if rec.queued_at is not None else 0.0
        running, before = ahead or (0, 0)
        return (f"Waiting for the engine · {running} run{'s' * (running != 1)} in progress, "
                f"{before} waiting before yours · {waited:.1f} s so far")
    if rec.waiting is not None and rec.done is None:  # admitted by Gradio, queued for KV blocks
        w, p = rec.waiting, rec.waiting.pool
        return (f"Waiting for the server: {ordinal(w.position)} in line · {now - rec.started_at:.1f} s so far · "
                f"this run may grow to {w.blocks_needed} KV blocks; {p.blocks_reserved:,} of the pool's "
                f"{p.blocks_total:,} are promised to the {p.active_runs} run{'s' if p.active_runs != 1 else ''} "
                "in progress")
    if not rec.steps and rec.done is None:
        read = f"{rec.prefilled:,} of {count(n, 'prompt token')} read" if rec.prefilled else count(n, 'prompt token')
        return f"Prefill of {read}… {now - rec.started_at:.1f} s so far (the first token comes after it)"
    g = len(rec.steps)
    ctx = context_text(n, g, None, context, len(rec.given))
    if rec.done is None:
        return f"Generating: {g:,} of at most {count(rec.max_steps, 'token')} · {ctx}"
    return f"Run ended: {reason_text(rec.done, rec.steps[-1] if rec.steps else None)} · {count(g, 'token')} · {ctx}"


def stats_markdown(info, rec: RunRecord) -> str:
    """The run's numbers: measured by the engine, or at this page in front of a server (each term
    marked with its definition)."""
    return gloss(_engine_stats(info, rec) if info.capabilities.local_timing else _page_stats(info, rec))


def _engine_stats(info, rec: RunRecord) -> str:
    """The run's numbers as a two-column table (measure, value): it fits any width without
    breaking a header or a number."""
    if not rec.steps:
        if rec.done is not None:
            return f"Run ended: **{reason_text(rec.done)}**, no token generated."
        return "No run yet." if rec.started_at is None else "Running: the numbers come with the first token."
    first = rec.steps[0]
    n = len(rec.steps)
    ctx = len(rec.prompt_ids) + len(rec.given) + n
    stored = getattr(info, "stored_bytes", None)
    cost = decode_cost(info.cfg, ctx, info.decode_dtype.itemsize, info.dtype.itemsize, stored)
    decode_ms = sum(s.ms for s in rec.steps[1:])
    tps = (n - 1) / (decode_ms / 1000) if decode_ms > 0 else 0.0
    ttft = f"{first.prefill_ms:.0f} ms" + (f" (+ {first.wait_ms / 1000:.1f} s queued)"
                                            if first.wait_ms and first.wait_ms >= 50 else "")
    costs = constraint_cost.cost_rows(rec)  # (none for a run without a constraint)
    reused = first.prompt_tokens_reused or 0
    prompt = f"{len(rec.prompt_ids)}" + (f" ({reused} read from the KV cache of an earlier run)" if reused else "")
    rows = [("prompt tokens", prompt), *([("given tokens (continued after)", f"{len(rec.given)}")] if rec.given else []),
            ("time to first token", ttft),
            ("generated", f"{n}"), ("decode speed", f"{tps:.1f} tok/s"),
            (f"FLOPs / token (at {ctx} ctx)", f"{si(cost.flops)} ({si(cost.attention_flops)} attention)"),
            (f"bytes read / token (at {ctx} ctx)", bytes_text(info, ctx, cost.bytes)),
            ("seed", f"{rec.seed}"), *costs]
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if rec.done is not None:
        lines.append(ended_markdown(rec.done, "the context window", info.max_seq_len, rec.steps[-1]))
    if costs:  # a constrained run: what its constraint cost, each step (folded)
        lines += ["", constraint_cost.cost_note(rec), "", constraint_cost.steps_html(rec)]
    return "\n".join(lines)


def bytes_text(info, ctx: int, read: int) -> str:
    """A decode step's bytes (weights and KV cache): as the GGUF file's blocks, with the float32
    figure beside them, or at the decode dtype."""
    if getattr(info, "stored_bytes", None):
        f32 = decode_cost(info.cfg, ctx, 4, info.dtype.itemsize).bytes
        return f"{binary_size(read)} as the GGUF file's blocks ({binary_size(f32)} at float32)"
    return f"{binary_size(read)} at {dtype_name(info.decode_dtype)}"


def _page_stats(info, rec: RunRecord) -> str:
    """Times measured at this page: the network and the server's queue included."""
    if not rec.steps:
        return "No run yet."
    n = len(rec.steps)
    ctx = len(rec.prompt_ids) + len(rec.given) + n
    arrived = [s.ms for s in rec.steps[1:]]
    decode_s = sum(arrived) / 1000
    tps = (n - 1) / decode_s if decode_s > 0 else 0.0
    flops = (f"{si(decode_cost(info.cfg, ctx, 2).flops)}" if info.cfg is not None else "– (no config)")
    lines = [
        f"| prompt tokens | time to first token (at the page) | generated | tokens/s (at the page) | "
        f"FLOPs / token (at {ctx} ctx) | seed |",
        "|---|---|---|---|---|---|",
        f"| {len(rec.prompt_ids)}{f' + {len(rec.given)} given' if rec.given else ''} | {rec.steps[0].prefill_ms:.0f} ms | {n} | {tps:.1f} | {flops} | {rec.seed} |",
        "",
        "Times are measured at this page: they include the network and the server's queue.",
    ]
    if rec.done is not None:
        lines.append(ended_markdown(rec.done, "the server's context window", info.max_seq_len,
                                    rec.steps[-1] if rec.steps else None))
    return "\n".join(lines)
