"""What the page's components show, from a run's record and the engine's description: HTML,
Markdown, data frames and CSS. Pure functions, no Gradio."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pandas as pd

from inference.device import dtype_name
from inference.events import DoneEvent, StepEvent
from inference.model.anatomy import decode_cost, memory_table, stages
from inference.serving.kv_pool import BLOCK_SIZE
from ui.run_state import RunRecord, run_summary

# Probability buckets for colouring generated tokens (HighlightedText categories).
BUCKETS = [(0.9, "p ≥ 0.9"), (0.5, "0.5 ≤ p < 0.9"), (0.1, "0.1 ≤ p < 0.5"), (0.0, "p < 0.1")]
COLOR_MAP = {"p ≥ 0.9": "#2e7d32", "0.5 ≤ p < 0.9": "#9ccc65", "0.1 ≤ p < 0.5": "#ffb300",
             "p < 0.1": "#e53935"}
# Compare A/B marks the first step where A and B differ; only its outputs have that entry.
COMPARE_COLOR_MAP = {**COLOR_MAP, "diverges here": "#8e24aa"}
# Why a run ended, as the page says it after "Run ended:".
REASONS = {"eos": "the model emitted its end-of-sequence token", "length": "max new tokens reached",
           "stop": "a stop string was found", "context": "the context window is full",
           "cancelled": "stopped on request (Stop, or a new run in this tab)"}


def si(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".rstrip()


def bucket(p: float | None) -> str | None:
    if p is None:
        return None
    return next(name for threshold, name in BUCKETS if p >= threshold)


def shown_prob(s: StepEvent) -> float | None:
    """The probability a token is coloured by: the one it was sampled with, else (in front of
    a server that gives only the raw distribution) the model's own."""
    return s.prob if s.prob is not None else s.raw_prob


def known(x) -> bool:
    """A number the engine knows: not None (in front of a server) and not NaN (no steps)."""
    return x is not None and x == x


def visible(text: str) -> str:
    """Whitespace made visible for token labels: ␣ space, ↵ newline, ⇥ tab, ∅ no text."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") if text else "∅"


def fmt_p(p: float | None) -> str:
    """A probability as shown everywhere: 4 decimals, or 3 significant digits below 1e-4 so that
    small numbers stay visible; a dash where the engine does not know it."""
    if not known(p):
        return "–"
    return f"{p:.4f}" if p >= 1e-4 or p == 0 else f"{p:.3g}"


def fmt_logp(p: float | None) -> str:
    if not known(p):
        return "–"
    return f"{math.log(p):.3f}" if p > 0 else "−∞"


def prob_html(p: float) -> str:
    """p and log p, one shown at a time by the page's switch (PROB_CSS)."""
    return f"<span class='tl-p'>{fmt_p(p)}</span><span class='tl-lp'>{fmt_logp(p)}</span>"


def named_prob_html(p: float | None, prefix: str = "") -> str:
    """"p = 0.8800" or "log p = -0.128": the "log " is switched with the number (PROB_CSS), so log
    mode never shows a log value called p. `prefix` goes before either ("raw ")."""
    return f"{prefix}<span class='tl-lp'>log </span>p = {prob_html(p)}"


def chosen_prob_html(prob: float | None, raw_prob: float | None) -> str:
    """The chosen token's probability and the model's own: "p = 0.8800 (raw p = 0.5000)"."""
    return f"{named_prob_html(prob)} ({named_prob_html(raw_prob, 'raw ')})"


@dataclass
class Chip:
    """One piece of the generated text as the page shows it: a token, or the byte tokens that
    make one character together."""
    text: str
    prob: float | None  # the probability the chip was sampled with: the product over its tokens
    steps: range  # the steps it spans
    cut: bool = False  # a character the end of the run cut off


def output_chips(rec: RunRecord, tokenizer) -> list[Chip]:
    chips = []
    for steps, complete in tokenizer.char_groups([s.token_id for s in rec.steps]):
        group = [rec.steps[i] for i in steps]
        text = "".join(s.text for s in group)
        if not complete:
            held = "".join(s.piece for s in group)
            text = f"{text}[cut off: {held}]" if rec.done is not None else text
        probs = [shown_prob(s) for s in group]
        chips.append(Chip(text, None if None in probs else math.prod(probs), steps, not complete))
    return chips


def highlighted_output(rec: RunRecord, tokenizer) -> list[tuple[str, str | None]]:
    """One (text, bucket) entry per chip; output_chips maps a click's index to its steps."""
    chips = output_chips(rec, tokenizer)
    out = [(c.text, bucket(c.prob)) for c in chips]
    tail = rec.done.tail if rec.done else ""
    if chips and chips[-1].cut:  # shown as cut off above, not as U+FFFD
        tail = tail.replace("\ufffd", "")
    if tail:
        out.append((tail, None))
    return out


def _bucket_class(p: float | None) -> str:
    """The colour class of a probability; tl-bu (uncoloured) where the engine does not know it."""
    if not known(p):
        return "tl-bu"
    return f"tl-b{next(i for i, (threshold, _) in enumerate(BUCKETS) if p >= threshold)}"


def _shown(text: str) -> str:
    """Generated text as HTML that shows every newline: a visible ↵, then the line break (the
    output is white-space: pre-wrap)."""
    return html.escape(text).replace("\n", "↵\n")


def legend_html() -> str:
    """What the output's colours mean; only shown under output that has them (output_html)."""
    return ("<div class='tl-legend'>colour = probability the token was sampled with: "
            + "".join(f"<span class='tl-key {_bucket_class(t)}'>{html.escape(name)}</span>" for t, name in BUCKETS)
            + "</div>")


def _popover(rec: RunRecord, chip: "Chip", tokenizer) -> str:
    """What hovering (or tapping) a generated token shows: its step, probabilities and the top
    alternatives the model had there."""
    first = rec.steps[chip.steps[0]]
    shown = first.top[:5]
    if all(c.id != first.token_id for c in shown):  # a sampled token further down: listed too, last
        shown = shown + [c for c in first.top if c.id == first.token_id]
    rows = "".join(
        f"<span class='tl-alt{' tl-alt-chosen' if c.id == first.token_id else ''}'>"
        f"<span>{html.escape(visible(c.piece))}</span><span>{prob_html(c.prob)}</span></span>"
        for c in shown)
    span = f"steps {chip.steps[0]}–{chip.steps[-1]}" if len(chip.steps) > 1 else f"step {chip.steps[0]}"
    return (f"<span class='tl-pop' role='tooltip'><span class='tl-pop-head'>{span} · id {first.token_id} · "
            f"{chosen_prob_html(first.prob, first.raw_prob)}</span>{rows}</span>")


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
            parts.append(f"<span class='tl-t {_bucket_class(c.prob)}' data-i='{i}' tabindex='0'>"
                         f"{_shown(c.text) or '∅'}{_popover(rec, c, tokenizer)}</span>")
        else:
            parts.append(f"<span class='tl-t {_bucket_class(c.prob)}' data-i='{i}' title='p {fmt_p(c.prob)}'>"
                         f"{_shown(c.text) or '∅'}</span>")
    tail = rec.done.tail if rec.done else ""
    if chips and chips[-1].cut:
        tail = tail.replace("\ufffd", "")
    if tail:
        parts.append(f"<span class='tl-tail' title='text held back until the end'>{_shown(tail)}</span>")
    text = rec.done.text if rec.done is not None else "".join(s.text for s in rec.steps)
    # No legend under a run that ended without a coloured token: there is nothing for it to explain.
    return (f"<div class='tl-out' data-text='{html.escape(text, quote=True)}'>{''.join(parts)}</div>"
            + (legend_html() if chips else ""))


def output_tokens(rec: RunRecord | None, tokenizer) -> list[dict]:
    """The generated text for API clients: one entry per chip (text, probability, first step)."""
    if rec is None:
        return []
    out = [{"token": c.text, "prob": c.prob, "step": c.steps[0]} for c in output_chips(rec, tokenizer)]
    tail = rec.done.tail if rec.done else ""
    if out and rec.steps and output_chips(rec, tokenizer)[-1].cut:
        tail = tail.replace("\ufffd", "")
    if tail:  # text held back until the end: no step of its own
        out.append({"token": tail, "prob": None, "step": None})
    return out


def _token_chips(tokenizer, ids: list[int]) -> str:
    chips = []
    for positions, complete in tokenizer.char_groups(ids):
        group = [ids[i] for i in positions]
        tokens = "".join(f"<span class='tl-tk{' tl-ctl' if tokenizer.is_control(i) else ''}'>"
                         f"{html.escape(visible(tokenizer.piece(i)))}<sub>{i}</sub></span>" for i in group)
        if len(group) == 1:
            chips.append(f"<span class='tl-chip'>{tokens}</span>")
        else:
            char = tokenizer.decode(group) if complete else "[cut off]"
            chips.append(f"<span class='tl-chip tl-char'><span class='tl-c'>{html.escape(visible(char))}"
                         f"</span><span class='tl-bytes'>{tokens}</span></span>")
    return "".join(chips)


def run_tokens_html(tokenizer, prompt_ids: list[int], generated_ids: list[int] | None = None) -> str:
    """The tokenization view: the prompt's tokens, and once there are any the generated ones."""
    out = prompt_tokens_html(tokenizer, prompt_ids)
    if generated_ids:
        out += (f"<div class='tl-tokens tl-gen-tokens'><div class='tl-title'>Generated: {len(generated_ids):,} tokens"
                f"</div><div class='tl-chips'>{_token_chips(tokenizer, generated_ids)}</div></div>")
    return out


def prompt_tokens_html(tokenizer, ids: list[int]) -> str:
    """The prompt's tokens as chips: one per token, and one per character made of byte tokens
    with those tokens beneath it; control tokens marked."""
    control = sum(tokenizer.is_control(i) for i in ids)
    return (f"<div class='tl-tokens'><div class='tl-title'>Prompt: {len(ids):,} tokens"
            + (f", {control:,} of them control tokens (outlined)" if control else "")
            + f"</div><div class='tl-chips'>{_token_chips(tokenizer, ids)}</div></div>")


def _bar(kind: str, p: float | None) -> str:
    width = 100 * p if known(p) else 0.0
    return (f"<span class='tl-bar'><span class='{kind}' style='width:{width:.2f}%'></span></span>"
            f"<span class='tl-num'>{prob_html(p)}</span>")


def bars_html(step: StepEvent | None, title: str = "", approx: str = "") -> str:
    """Horizontal bars: raw model probability and final sampling probability per candidate;
    `approx` says how approximate the numbers are, or where they come from (empty when they are
    the model's). A column the engine cannot give (in front of a server) says so in its header
    and shows dashes, never zeros."""
    if step is None:
        return "<div class='tl-bars tl-empty'>Generate to see each step's candidates.</div>"
    rows = []
    for c in step.top:
        chosen = c.id == step.token_id
        label = html.escape(visible(c.piece))
        rows.append(
            f"<div class='tl-row{' tl-chosen' if chosen else ''}'>"
            f"<span class='tl-tok' title='id {c.id}'>{'▶ ' if chosen else ''}{label}</span>"
            f"{_bar('tl-raw', c.raw_prob)}{_bar('tl-final', c.prob)}</div>")
    missing = " (not given by the server)"
    raw_head = "raw model probability" + ("" if any(known(c.raw_prob) for c in step.top) else missing)
    final_head = "final (sampled from)" + ("" if any(known(c.prob) for c in step.top) else missing)
    rank = (f", rank {step.rank}" if step.rank is not None
            else ", rank not known (below the returned candidates)")
    head = (f"<div class='tl-title'>{html.escape(title or f'Step {step.step}')}: chose "
            f"<b>{html.escape(visible(step.piece))}</b> (id {step.token_id}) with "
            f"{chosen_prob_html(step.prob, step.raw_prob)}{rank}</div>"
            + (f"<div class='tl-approx'>{html.escape(approx)}</div>" if approx else "")
            + "<div class='tl-row tl-head'><span class='tl-tok'>token</span>"
            f"<span class='tl-h2'>{raw_head}</span>"
            f"<span class='tl-h2'>{final_head}</span></div>")
    return f"<div class='tl-bars'>{head}{''.join(rows)}</div>"


def approx_note(info) -> str:
    """What the page says beside its numbers when decoding is not at the model's dtype."""
    r = info.decode_error
    if r is None:
        return ""
    return (f"Approximate: decode steps read {dtype_name(info.decode_dtype)} copies of the weights. "
            f"Measured at start-up against {dtype_name(info.dtype)} over {r.steps} steps: "
            f"probabilities differ by up to {r.max_prob_diff:.4f}; the most likely token agreed on "
            f"{100 * r.top1_agreement:.0f}% of steps. Start with --decode-dtype same for exact numbers.")


PROB_CSS = """
.tl-lp { display: none; }
/* !important: gradio also adds each rule prefixed with its container (.gradio-container .contain
   .tl-lp), which outranks these and, the body being outside the container, never flips. */
body.tl-show-logp .tl-p { display: none !important; }
body.tl-show-logp .tl-lp { display: inline !important; }
.tl-approx { color: #b26a00; font-size: 12px; margin-bottom: 4px; }
.tl-tokens .tl-chips { display: flex; flex-wrap: wrap; gap: 3px; max-height: 220px; overflow: auto; }
.tl-chip { display: inline-flex; flex-direction: column; align-items: center; border: 1px solid rgba(128,128,128,.3);
           border-radius: 4px; padding: 1px 3px; font-family: ui-monospace, monospace; font-size: 12px; }
.tl-tk sub { opacity: .6; margin-left: 2px; }
.tl-ctl { outline: 2px solid #8e24aa; border-radius: 3px; }
.tl-char .tl-c { font-size: 15px; }
.tl-char .tl-bytes { display: flex; gap: 2px; font-size: 10px; opacity: .8; }
"""


BARS_CSS = """
.tl-bars { font-family: ui-monospace, monospace; font-size: 13px; }
.tl-title { margin-bottom: 6px; }
/* A number column holds the widest value whole: 8.89e-05, -103.456. */
.tl-row { display: grid; grid-template-columns: 9em 1fr 5.2em 1fr 5.2em; gap: 6px; align-items: center; padding: 1px 0; }
.tl-head { font-weight: 600; font-size: 10px; opacity: .7; white-space: nowrap; }
.tl-head .tl-bar { background: none; height: auto; }
.tl-chosen { background: rgba(255, 213, 79, .25); font-weight: 600; }
.tl-tok { overflow: hidden; white-space: nowrap; text-overflow: ellipsis; }
.tl-bar { background: rgba(128,128,128,.15); height: 14px; display: block; position: relative; }
.tl-raw, .tl-final { display: block; height: 100%; }
.tl-raw { background: #5c6bc0; }
.tl-final { background: #26a69a; }
.tl-num { text-align: right; white-space: nowrap; }
"""


def kv_frame(rec: RunRecord) -> pd.DataFrame:
    """KV-cache MiB per step: used (prefill jump, then one position per step) and allocated.
    In front of a server, which does not say what one request holds: this run's positions times
    the formula's bytes per position, where the model's config is known."""
    rows = []
    if rec.steps and rec.steps[0].kv_cache_bytes is None:
        per, n = rec.kv_bytes_per_token, len(rec.prompt_ids)
        if per:
            series = "this run, by the formula"
            rows.append({"step": -1, "MiB": 0.0, "series": series})
            rows += [{"step": s.step, "MiB": per * (n + s.step) / 2**20, "series": series} for s in rec.steps]
        return pd.DataFrame(rows, columns=["step", "MiB", "series"])
    if rec.steps:  # before prefill the cache is empty: the first step shows the prefill's jump
        rows.append({"step": -1, "MiB": 0.0, "series": "used"})
        rows.append({"step": -1, "MiB": 0.0, "series": "allocated"})
    for s in rec.steps:
        rows.append({"step": s.step, "MiB": s.kv_cache_bytes / 2**20, "series": "used"})
        rows.append({"step": s.step, "MiB": s.kv_cache_capacity_bytes / 2**20, "series": "allocated"})
        if s.pool is not None:
            rows.append({"step": s.step, "MiB": s.pool.bytes_used / 2**20, "series": "server pool, all runs"})
    return pd.DataFrame(rows, columns=["step", "MiB", "series"])


def step_axis(first: int = 0) -> dict:
    """gr.LinePlot settings for a per-step x axis: from the first step, never below it (Vega-Lite
    pads a short domain into negative steps otherwise). Ticks stay Vega-Lite's: Gradio's LinePlot
    passes no tickMinStep, so with few steps they may still fall between whole steps."""
    return {"x": "step", "x_lim": [first, None]}


def latency_frame(rec: RunRecord) -> pd.DataFrame:
    return pd.DataFrame([{"step": s.step, "ms": s.ms} for s in rec.steps[1:]], columns=["step", "ms"])


def pool_markdown(step: StepEvent | None) -> str:
    """This run's blocks of the paged KV cache, beside the server's whole pool."""
    if step is None or step.pool is None:
        return ""
    p = step.pool
    return (f"\n\n**Paged KV cache**: this run holds **{step.kv_blocks} block{'s' * (step.kv_blocks != 1)}** "
            f"of {BLOCK_SIZE} positions "
            f"({si(step.kv_cache_capacity_bytes, 'B')}). The server's pool (all runs): "
            f"**{p.blocks_used:,} of {p.blocks_total:,} blocks** in use ({si(p.bytes_used, 'B')} of "
            f"{si(p.blocks_total * p.bytes_per_block, 'B')}) by {p.active_runs} "
            f"run{'s' if p.active_runs != 1 else ''}, {p.blocks_reserved:,} promised to them"
            + (f", {p.waiting_runs} waiting" if p.waiting_runs else "")
            + (f"; {p.blocks_cached:,} kept from finished runs for a prompt that starts the same way (a chat's "
               "next turn), given back when a run needs them" if p.blocks_cached else "") + ".")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def kv_formula(info, kv_bytes: int | None = None) -> str:
    """The cache's formula with this model's numbers; with kv_bytes (a step's cache use), the
    positions it holds: the prompt and every token but the newest, not yet fed back."""
    cfg = info.cfg
    b = info.dtype.itemsize
    per = cfg.kv_bytes_per_token(b)
    text = (f"**KV cache** = 2 × layers × KV heads × head dim × bytes per value × positions = "
            f"2 × {cfg.n_layers} × {cfg.n_kv_heads} × {cfg.head_dim} × {b} × positions = "
            f"**{per:,} bytes per position**")
    if kv_bytes:
        text += f"; × {kv_bytes // per} positions held = {kv_bytes:,} bytes ({kv_bytes / 2**20:.2f} MiB)"
    return text


def model_card(info) -> str:
    cfg = info.cfg
    params = cfg.param_counts()
    cost = decode_cost(cfg, 1, info.dtype.itemsize)
    return (f"**{html.escape(info.name)}** · {cfg.n_layers} layers · hidden {cfg.hidden_size} · "
            f"{cfg.n_heads} heads / {cfg.n_kv_heads} KV heads · head dim {cfg.head_dim} · "
            f"FFN {cfg.intermediate_size} · vocab {cfg.vocab_size:,} · context {cfg.max_seq_len:,} · "
            f"RoPE θ {cfg.rope_theta:g}{'' if cfg.rope_scaling.rope_type == 'default' else ' (' + cfg.rope_scaling.rope_type + ' scaling)'}"
            f" · {'tied' if cfg.tie_word_embeddings else 'untied'} LM head  \n"
            f"**{params['total'] / 1e6:.1f} M parameters** · {dtype_name(info.dtype)}"
            f"{'' if info.decode_dtype == info.dtype else ' (decode matmuls in ' + dtype_name(info.decode_dtype) + ')'} on "
            f"{info.device} · ≈ {si(cost.flops, 'FLOPs')} per token at a 1-token context "
            f"(2 × matmul parameters + attention) · every probability on this page is computed at "
            f"{dtype_name(info.decode_dtype)}"
            + (f"  \n⚠ {approx_note(info)}" if info.decode_error else ""))


def stats_markdown(info, rec: RunRecord) -> str:
    """The run's numbers as a two-column table (measure, value): it fits any width without
    breaking a header or a number."""
    if not rec.steps:
        if rec.done is not None:
            return f"Run ended: **{REASONS.get(rec.done.reason, rec.done.reason)}**, no token generated."
        return "No run yet." if rec.started_at is None else "Running: the numbers come with the first token."
    first = rec.steps[0]
    n = len(rec.steps)
    ctx = len(rec.prompt_ids) + n
    cost = decode_cost(info.cfg, ctx, info.dtype.itemsize)
    decode_ms = sum(s.ms for s in rec.steps[1:])
    tps = (n - 1) / (decode_ms / 1000) if decode_ms > 0 else 0.0
    ttft = f"{first.prefill_ms:.0f} ms" + (f" (+ {first.wait_ms / 1000:.1f} s queued)"
                                            if first.wait_ms and first.wait_ms >= 50 else "")
    reused = first.prompt_tokens_reused or 0
    prompt = f"{len(rec.prompt_ids)}" + (f" ({reused} read from the KV cache of an earlier run)" if reused else "")
    rows = [("prompt tokens", prompt), ("time to first token", ttft),
            ("generated", f"{n}"), ("decode speed", f"{tps:.1f} tok/s"),
            (f"FLOPs / token (at {ctx} ctx)", f"{si(cost.flops)} ({si(cost.attention_flops)} attention)"),
            ("seed", f"{rec.seed}")]
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if rec.done is not None:
        lines.append(ended_markdown(rec.done, "the context window", info.cfg.max_seq_len))
    return "\n".join(lines)


def ended_markdown(done: DoneEvent, window: str, context: int) -> str:
    """Why the run ended, under its statistics (the local engine's and a server's alike)."""
    return (f"\nRun ended: **{REASONS.get(done.reason, done.reason)}**."
            + (f" Max new tokens was capped at {done.max_new_tokens} to fit {window} of {context}."
               if done.capped else ""))


def context_text(n_prompt: int, n_generated: int | None, max_new: int | None, context: int) -> str:
    """The context counter: prompt + generated (or the most that may be) / the context window."""
    if n_generated is None:
        room = context - n_prompt
        most = min(max_new or 0, room)
        return (f"Context: **{n_prompt:,}** prompt tokens + up to {most:,} new = {n_prompt + most:,} "
                f"of {context:,}" + (f" (max new tokens will be lowered to {room:,})" if max_new and max_new > room else ""))
    return f"Context: **{n_prompt:,}** prompt + **{n_generated:,}** generated = {n_prompt + n_generated:,} of {context:,}"


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
        return (f"Waiting for the server: {_ordinal(w.position)} in line · {now - rec.started_at:.1f} s so far · "
                f"this run may grow to {w.blocks_needed} KV blocks; {p.blocks_reserved:,} of the pool's "
                f"{p.blocks_total:,} are promised to the {p.active_runs} run{'s' if p.active_runs != 1 else ''} "
                "in progress")
    if not rec.steps and rec.done is None:
        read = f"{rec.prefilled:,} of {n:,} prompt tokens read" if rec.prefilled else f"{n:,} prompt tokens"
        return f"Prefill of {read}… {now - rec.started_at:.1f} s so far (the first token comes after it)"
    g = len(rec.steps)
    ctx = context_text(n, g, None, context)
    if rec.done is None:
        return f"Generating: {g:,} of at most {rec.max_steps:,} tokens · {ctx}"
    return f"Run ended: {REASONS.get(rec.done.reason, rec.done.reason)} · {g:,} tokens · {ctx}"


# ---------------------------------------------------------------- inside one token

def stages_markdown(info, n_prompt: int, step: int) -> str:
    """The path of one token: prefill over the prompt and the selected decode step side by side."""
    cfg, b, b_dec = info.cfg, info.dtype.itemsize, info.decode_dtype.itemsize
    ctx = n_prompt + step
    pre = stages(cfg, n_prompt, n_prompt, b)
    dec = stages(cfg, 1, ctx, b_dec, b)
    lines = [f"Prefill: {n_prompt} prompt tokens at once. Decode step {step}: 1 token attending to "
             f"{ctx} positions. Decode bytes are the weights read at {dtype_name(info.decode_dtype)} "
             f"and the KV cache at {dtype_name(info.dtype)}.", "",
             "| stage | prefill shape | prefill FLOPs | decode shape | decode FLOPs | decode bytes |",
             "|---|---|---|---|---|---|"]
    for p, d in zip(pre, dec):
        lines.append(f"| {p.name} | {p.shape} | {si(p.flops)} | {d.shape} | {si(d.flops)} | {si(d.bytes, 'B')} |")
    lines.append(f"| **per token** | | {si(pre[-1].flops / n_prompt)} | | {si(dec[-1].flops)} | "
                 f"{si(dec[-1].bytes, 'B')} |")
    return "\n".join(lines)


def attention_html(capture, tokenizer, max_rows: int = 400) -> str:
    """Heatmap: context positions (rows, labelled) x heads (columns) for the captured layer."""
    att = capture.attention  # (heads, T_ctx)
    n_heads, T = att.shape
    start = max(0, T - max_rows)
    head = "".join(f"<th>h{i}</th>" for i in range(n_heads))
    rows = []
    for pos in range(start, T):
        cells = "".join(
            f"<td style='background: rgba(229,57,53,{min(1.0, float(att[h, pos]) ** 0.5):.3f})' "
            f"title='head {h}, position {pos}: {float(att[h, pos]):.4f}'>{float(att[h, pos]):.2f}</td>"
            for h in range(n_heads))
        label = html.escape(visible(tokenizer.piece(capture.context_ids[pos])))
        rows.append(f"<tr><th class='tl-pos'>{pos}</th><th class='tl-ctx'>{label}</th>{cells}</tr>")
    note = f"<div>showing the last {max_rows} of {T} positions</div>" if start else ""
    return (f"<div class='tl-att'><div class='tl-title'>Layer {capture.layer}: where the new token's "
            f"query looked (each head's column of weights sums to 1; cell shade ∝ √weight)</div>{note}"
            f"<table><tr><th>pos</th><th>token</th>{head}</tr>{''.join(rows)}</table></div>")


def pattern_html(pattern, context_ids: list[int], tokenizer, layer: int, head: int, max_positions: int = 96) -> str:
    """The full causal attention pattern of one head: a row per query position, a column per key
    position, shade ∝ √weight; hovering a cell names both tokens (PATTERN_JS)."""
    n_heads, T, _ = pattern.shape
    head = min(max(int(head), 0), n_heads - 1)
    start = max(0, T - max_positions)
    w = pattern[head, start:, start:]
    labels = [html.escape(visible(tokenizer.piece(i))) for i in context_ids[start:T]]
    cols = "".join(f"<th class='tl-k' data-k='{start + j}' title='key {start + j}: {lab}'><span>{lab}</span></th>"
                   for j, lab in enumerate(labels))
    rows = []
    for i, lab in enumerate(labels):
        cells = []
        for j in range(len(labels)):
            if j > i:
                cells.append("<td class='tl-future'></td>")
            else:
                v = float(w[i, j])
                cells.append(f"<td data-q='{start + i}' data-k='{start + j}' data-w='{v:.4f}' "
                             f"style='background: rgba(229,57,53,{min(1.0, v ** 0.5):.3f})'></td>")
        rows.append(f"<tr><th class='tl-q' data-q='{start + i}'>{start + i} {lab}</th>{''.join(cells)}</tr>")
    note = (f" Showing the last {max_positions} of {T} positions (weights before them not shown)."
            if start else "")
    return (f"<div class='tl-pattern'><div class='tl-title'>Layer {layer}, head {head}: every query position "
            f"(rows) over the positions it may see (columns); shade ∝ √weight, each row sums to 1.{note}</div>"
            f"<div class='tl-pat-info'>Hover a cell: which token looks at which.</div>"
            f"<div class='tl-pat-scroll'><table class='{'tl-big' if len(labels) <= 40 else ''}'><tr><th></th>{cols}</tr>"
            f"{''.join(rows)}</table></div></div>")


def lens_html(capture, tokenizer) -> str:
    """The logit lens: each layer's residual stream through the final norm and LM head."""
    rows = []
    for layer, top in enumerate(capture.lens):
        cells = "".join(f"<td>{html.escape(visible(tokenizer.piece(i)))} <small>{prob_html(p)}</small></td>"
                        for i, p in top)
        rows.append(f"<tr><th>after layer {layer}</th>{cells}</tr>")
    return ("<div class='tl-lens'><div class='tl-title'>Logit lens: the top tokens each layer's "
            "residual stream would predict</div><table>" + "".join(rows) + "</table></div>")


def memory_markdown(info) -> str:
    cfg, b = info.cfg, info.dtype.itemsize
    lines = [f"| component | parameters | bytes at {dtype_name(info.dtype)} |", "|---|---|---|"]
    for name, n, nbytes in memory_table(cfg, b):
        lines.append(f"| {name} | {n:,} | {si(nbytes, 'B')} |")
    head = cfg.vocab_size * cfg.hidden_size
    if cfg.tie_word_embeddings:
        lines.append(f"\nThe LM head **shares the embedding matrix** (tied): that saves {head:,} "
                     f"parameters, {si(head * b, 'B')} ({100 * head / (cfg.param_counts()['total'] + head):.0f}% "
                     "of an untied model).")
    else:
        lines.append(f"\nThe LM head has its own matrix (untied): {head:,} parameters, {si(head * b, 'B')}.")
    return "\n".join(lines)


INSPECT_CSS = """
.tl-att table, .tl-lens table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 12px; }
.tl-att td, .tl-att th, .tl-lens td, .tl-lens th { padding: 1px 5px; border: 1px solid rgba(128,128,128,.2); white-space: nowrap; }
.tl-att { max-height: 480px; overflow: auto; }
.tl-lens { overflow-x: auto; }
.tl-pattern .tl-pat-scroll { max-height: 560px; max-width: 100%; overflow: auto; }
.tl-pattern table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 10px; }
.tl-pattern td { width: 9px; min-width: 9px; height: 9px; padding: 0; border: 1px solid rgba(128,128,128,.08); }
.tl-pattern table.tl-big td { width: 15px; min-width: 15px; height: 15px; }
.tl-pattern td.tl-future { background: rgba(128,128,128,.06); }
.tl-pattern th { font-weight: 400; white-space: nowrap; padding: 0 3px; }
.tl-pattern th.tl-k { vertical-align: bottom; height: 70px; }
.tl-pattern th.tl-k span { writing-mode: vertical-rl; transform: rotate(180deg); display: inline-block; max-height: 70px; overflow: hidden; }
.tl-pattern th.tl-q { text-align: right; position: sticky; left: 0; background: var(--background-fill-primary, #fff); }
.tl-pattern th.tl-hl { background: #ffd54f !important; color: #000; }
.tl-pattern td.tl-hl { outline: 2px solid #000; }
.tl-pat-info { font-family: ui-monospace, monospace; font-size: 12px; min-height: 1.4em; margin: 4px 0; }
"""

# The page's layout: the main grid (prompt and output on the left, settings and the bars on the
# right; on a narrow screen prompt, output, bars, then settings), the generated text with its
# popovers, and tables that scroll sideways instead of breaking words.
LAYOUT_CSS = """
#main-grid { display: grid !important; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr);
             grid-template-rows: auto auto 1fr; align-items: start;
             grid-template-areas: "input settings" "output settings" "output bars"; }
#main-grid > * { min-width: 0 !important; width: auto !important; }
#input-col { grid-area: input; } #settings-col { grid-area: settings; }
#output-col { grid-area: output; } #bars-col { grid-area: bars; }
@media (max-width: 860px) {
  #main-grid { grid-template-columns: minmax(0, 1fr); grid-template-areas: "input" "output" "bars" "settings"; }
}
#status { min-height: 1.5em; }
#status p, #context-count p { margin: 0; }
.tl-out { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, monospace; font-size: 14px;
          line-height: 1.9; padding: 6px 8px; border: 1px solid rgba(128,128,128,.25); border-radius: 6px;
          min-height: 3.5em; max-height: 480px; overflow-y: auto; }
.tl-out.tl-empty { color: rgba(128,128,128,.9); font-family: inherit; }
.tl-t { position: relative; cursor: pointer; border-radius: 3px; padding: 1px 0; }
.tl-t:hover, .tl-t:focus { outline: 2px solid #1e88e5; outline-offset: 0; }
.tl-b0 { background: rgba(46,125,50,.35); } .tl-b1 { background: rgba(156,204,101,.45); }
.tl-b2 { background: rgba(255,179,0,.45); } .tl-b3 { background: rgba(229,57,53,.40); }
.tl-tail { opacity: .7; }
.tl-pop { display: none; position: absolute; z-index: 50; left: 0; top: 1.7em; min-width: 15em; max-width: 80vw;
          white-space: normal; background: var(--background-fill-primary, #fff); color: var(--body-text-color, #222);
          border: 1px solid rgba(128,128,128,.5); border-radius: 6px; padding: 4px 6px; box-shadow: 0 2px 8px rgba(0,0,0,.25);
          font-size: 12px; line-height: 1.4; cursor: default; }
.tl-t:hover > .tl-pop, .tl-t:focus > .tl-pop { display: block; }
/* One popover at a time: the hovered token's, else the focused (tapped) one's. */
.tl-out:has(.tl-t:hover) .tl-t:focus:not(:hover) > .tl-pop { display: none; }
.tl-pop-head { display: block; opacity: .8; margin-bottom: 2px; white-space: nowrap; }
.tl-alt { display: flex; justify-content: space-between; gap: 12px; white-space: pre; }
.tl-alt-chosen { font-weight: 700; }
.tl-legend { font-size: 12px; margin-top: 4px; display: flex; flex-wrap: wrap; gap: 6px; align-items: center; }
.tl-key { padding: 0 6px; border-radius: 3px; white-space: nowrap; }
.tl-stale { opacity: .75; font-style: italic; }
.tl-bars { overflow-x: auto; }
.tl-bars .tl-row { min-width: 290px; }
.tl-head .tl-h2 { grid-column: span 2; overflow: hidden; text-overflow: ellipsis; }
@media (max-width: 500px) { .tl-row { grid-template-columns: 6.5em 1fr 5.2em 1fr 5.2em; gap: 4px; } }
#stats table, #replay-stages table, #compare-summary table, #likely-table table, #stages table, #memory table {
  display: block; overflow-x: auto; max-width: 100%; width: max-content; border: none; }
#stats :is(th, td), #replay-stages :is(th, td), #compare-summary :is(th, td), #likely-table :is(th, td),
#stages :is(th, td), #memory :is(th, td) { white-space: nowrap; word-break: normal; overflow-wrap: normal; }
#stats td:last-child { font-variant-numeric: tabular-nums; }
.tl-gen-tokens { margin-top: 8px; }
.tl-downloads { display: flex; flex-wrap: wrap; gap: 8px; font-size: 13px; }
.tl-downloads.tl-empty { opacity: .7; font-size: 12px; }
.tl-dl { padding: 4px 10px; border: 1px solid rgba(128,128,128,.4); border-radius: 6px; text-decoration: none; }
#conversation .tl-turn { margin: 2px 0; padding: 2px 6px; border-left: 3px solid rgba(128,128,128,.4); white-space: pre-wrap; }
#conversation .tl-turn-assistant { border-left-color: #26a69a; }
"""


# ---------------------------------------------------------------- sampling experiments

def run_chart_frames(rec: RunRecord) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = []
    for s in rec.steps:  # a number the engine does not know (None) is left out, not drawn as 0
        if shown_prob(s) is not None:
            rows.append({"step": s.step, "value": shown_prob(s), "metric": "chosen-token probability"})
        if s.entropy is not None:
            rows.append({"step": s.step, "value": s.entropy, "metric": "raw entropy (nats)"})
    ranks = pd.DataFrame([{"step": s.step, "rank": s.rank} for s in rec.steps if s.rank is not None],
                         columns=["step", "rank"])
    return pd.DataFrame(rows, columns=["step", "value", "metric"]), ranks


def stages_table(original, replayed, tokenizer, chosen: int) -> str:
    lines = [f"Chosen token: **{html.escape(visible(tokenizer.piece(chosen)))}** (id {chosen}).", "",
             "| stage | kept (run) | mass removed (run) | chosen rank, p (run) | kept (replay) | "
             "mass removed (replay) | chosen rank, p (replay) |", "|---|---|---|---|---|---|---|"]

    def rank(st):
        return "removed" if st.chosen_rank is None else f"#{st.chosen_rank}, {prob_html(st.chosen_prob)}"

    for a, b in zip(original, replayed):
        lines.append(f"| {a.name} | {a.kept:,} | {fmt_p(a.mass_removed)} | {rank(a)} | {b.kept:,} | "
                     f"{fmt_p(b.mass_removed)} | {rank(b)} |")
    return "\n".join(lines)


def replay_bars(step: StepEvent, final_run, final_replay, tokenizer, n: int = 10) -> str:
    """The step's candidates: raw, final in the run, final under the replayed settings."""
    ids = {c.id for c in step.top}
    values, top = final_replay.topk(n)
    ids |= {i for i, v in zip(top.tolist(), values.tolist()) if v > 0}
    ids = sorted(ids, key=lambda i: (-float(final_replay[i]), -float(final_run[i])))[: n + 2]
    rows = []
    for i in ids:
        chosen = i == step.token_id
        rows.append(
            f"<div class='tl-row{' tl-chosen' if chosen else ''}'>"
            f"<span class='tl-tok'>{'▶ ' if chosen else ''}{html.escape(visible(tokenizer.piece(i)))}</span>"
            f"<span class='tl-bar'><span class='tl-raw' style='width:{100 * float(final_run[i]):.2f}%'></span></span>"
            f"<span class='tl-num'>{prob_html(float(final_run[i]))}</span>"
            f"<span class='tl-bar'><span class='tl-final' style='width:{100 * float(final_replay[i]):.2f}%'></span></span>"
            f"<span class='tl-num'>{prob_html(float(final_replay[i]))}</span></div>")
    head = ("<div class='tl-row tl-head'><span class='tl-tok'>token</span><span class='tl-h2'>final in the run</span>"
            "<span class='tl-h2'>final, replayed</span></div>")
    return f"<div class='tl-bars'>{head}{''.join(rows)}</div>"


def compare_summary(a: RunRecord, b: RunRecord, at: int | None) -> str:
    sa, sb = run_summary(a), run_summary(b)
    lines = []
    if at is None:
        lines.append("**A and B produced the same tokens.**")
    elif at < min(len(a.steps), len(b.steps)):
        x, y = a.steps[at], b.steps[at]
        lines.append(f"**First divergence at step {at}**: A chose **{html.escape(visible(x.piece))}** "
                     f"({named_prob_html(shown_prob(x))}), B chose **{html.escape(visible(y.piece))}** "
                     f"({named_prob_html(shown_prob(y))}).")
    else:
        lines.append(f"**Same tokens until step {at}, where one run stopped.**")
    lines += ["", "| run | tokens | mean chosen-token p | mean raw entropy (nats) | perplexity of its text |",
              "|---|---|---|---|---|"]
    for name, s in (("A", sa), ("B", sb)):
        entropy, ppl = (f"{x:.3f}" if known(x) else "–" for x in (s["mean_entropy"], s["perplexity"]))
        lines.append(f"| {name} | {s['tokens']} | {fmt_p(s['mean_p'])} | {entropy} | {ppl} |")
    return "\n".join(lines)


def highlighted_with_marker(rec: RunRecord, at: int | None) -> list[tuple[str, str | None]]:
    out = [(s.text, "diverges here" if i == at else bucket(shown_prob(s))) for i, s in enumerate(rec.steps)]
    if rec.done and rec.done.tail:
        out.append((rec.done.tail, None))
    return out


def downloads_html(run_url: str | None, settings_url: str | None) -> str:
    """Links to a run's downloads (addresses relative to the page), or a note before any run."""
    if not run_url:
        return "<div class='tl-downloads tl-empty'>Downloads of the run's steps and settings come with its end.</div>"
    return (f"<div class='tl-downloads'><a class='tl-dl' id='download-run' href='{html.escape(run_url, quote=True)}' "
            f"download>Download run (JSONL)</a><a class='tl-dl' id='download-settings' "
            f"href='{html.escape(settings_url, quote=True)}' download>Download settings (JSON)</a></div>")


def conversation_html(history: list[dict]) -> str:
    """The chat so far (earlier turns, oldest first); empty when there is none."""
    if not history:
        return ""
    turns = "".join(f"<div class='tl-turn tl-turn-{html.escape(m['role'])}'><b>{html.escape(m['role'])}:</b> "
                    f"{html.escape(m['content'])}</div>" for m in history)
    return (f"<div class='tl-conv'><div class='tl-title'>Conversation so far ({len(history) // 2} "
            f"turn{'s' * (len(history) // 2 != 1)}; your next message continues it)</div>{turns}</div>")


def likelihood_table(scores) -> str:
    if not scores:
        return ""
    total = sum(lp for _, _, lp in scores)
    lines = ["| token | id | p | log p |", "|---|---|---|---|"]
    for i, piece, lp in scores:
        lines.append(f"| {html.escape(visible(piece))} | {i} | {fmt_p(math.exp(lp))} | {lp:.3f} |")
    lines.append(f"| **all {len(scores)} tokens** | | {fmt_p(math.exp(total))} | {total:.3f} |")
    return "\n".join(lines)


# Every stylesheet of the page, as launch() passes it.
PAGE_CSS = BARS_CSS + INSPECT_CSS + PROB_CSS + LAYOUT_CSS
