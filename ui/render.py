"""What the page's components show, from a run's record and the engine's description: HTML,
Markdown, data frames and CSS. Pure functions, no Gradio."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass

import pandas as pd

from inference.device import dtype_name
from inference.events import StepEvent
from inference.anatomy import decode_cost, memory_table, stages
from inference.kv_pool import BLOCK_SIZE
from ui.run_state import RunRecord, run_summary

# Probability buckets for colouring generated tokens (HighlightedText categories).
BUCKETS = [(0.9, "p ≥ 0.9"), (0.5, "0.5 ≤ p < 0.9"), (0.1, "0.1 ≤ p < 0.5"), (0.0, "p < 0.1")]
COLOR_MAP = {"p ≥ 0.9": "#2e7d32", "0.5 ≤ p < 0.9": "#9ccc65", "0.1 ≤ p < 0.5": "#ffb300",
             "p < 0.1": "#e53935", "diverges here": "#8e24aa"}
REASONS = {"eos": "end of sequence token", "length": "max new tokens reached",
           "stop": "stop string found", "context": "context window full", "cancelled": "stopped"}


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


def prompt_tokens_html(tokenizer, ids: list[int]) -> str:
    """The prompt's tokens as chips: one per token, and one per character made of byte tokens
    with those tokens beneath it; control tokens marked."""
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
    control = sum(tokenizer.is_control(i) for i in ids)
    return (f"<div class='tl-tokens'><div class='tl-title'>{len(ids)} tokens"
            + (f", {control} of them control tokens (outlined)" if control else "")
            + f"</div><div class='tl-chips'>{''.join(chips)}</div></div>")


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
            f"<b>{html.escape(visible(step.piece))}</b> (id {step.token_id}) with p = {prob_html(step.prob)} "
            f"(raw {prob_html(step.raw_prob)}){rank}</div>"
            + (f"<div class='tl-approx'>{html.escape(approx)}</div>" if approx else "")
            + "<div class='tl-row tl-head'><span class='tl-tok'>token</span>"
            f"<span class='tl-bar'>{raw_head}</span><span class='tl-num'></span>"
            f"<span class='tl-bar'>{final_head}</span><span class='tl-num'></span></div>")
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
body.tl-show-logp .tl-p { display: none; }
body.tl-show-logp .tl-lp { display: inline; }
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
.tl-row { display: grid; grid-template-columns: 9em 1fr 4.5em 1fr 4.5em; gap: 6px; align-items: center; padding: 1px 0; }
.tl-head { font-weight: 600; font-size: 10px; opacity: .7; white-space: nowrap; }
.tl-head .tl-bar { background: none; height: auto; }
.tl-chosen { background: rgba(255, 213, 79, .25); font-weight: 600; }
.tl-tok { overflow: hidden; white-space: nowrap; text-overflow: ellipsis; }
.tl-bar { background: rgba(128,128,128,.15); height: 14px; display: block; position: relative; }
.tl-raw, .tl-final { display: block; height: 100%; }
.tl-raw { background: #5c6bc0; }
.tl-final { background: #26a69a; }
.tl-num { text-align: right; }
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


def latency_frame(rec: RunRecord) -> pd.DataFrame:
    return pd.DataFrame([{"step": s.step, "ms": s.ms} for s in rec.steps[1:]], columns=["step", "ms"])


def pool_markdown(step: StepEvent | None) -> str:
    """This run's blocks of the paged KV cache, beside the server's whole pool."""
    if step is None or step.pool is None:
        return ""
    p = step.pool
    return (f"\n\n**Paged KV cache**: this run holds **{step.kv_blocks} blocks** of {BLOCK_SIZE} positions "
            f"({si(step.kv_cache_capacity_bytes, 'B')}). The server's pool (all runs): "
            f"**{p.blocks_used:,} of {p.blocks_total:,} blocks** in use ({si(p.bytes_used, 'B')} of "
            f"{si(p.blocks_total * p.bytes_per_block, 'B')}) by {p.active_runs} "
            f"run{'s' if p.active_runs != 1 else ''}, {p.blocks_reserved:,} promised to them"
            + (f", {p.waiting_runs} waiting" if p.waiting_runs else "") + ".")


def wait_markdown(rec: RunRecord) -> str:
    """What a queued user sees: their place and how long they have waited."""
    w = rec.waiting
    if w is None:
        return ""
    p = w.pool
    return (f"⏳ **Waiting for the server**: {_ordinal(w.position)} in line, "
            f"{time.monotonic() - rec.started:.1f} s so far. This run may grow to {w.blocks_needed} KV blocks; "
            f"{p.blocks_reserved:,} of the pool's {p.blocks_total:,} are promised to the {p.active_runs} "
            f"run{'s' if p.active_runs != 1 else ''} in progress.")


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
    if not rec.steps:
        return "No run yet."
    first = rec.steps[0]
    n = len(rec.steps)
    ctx = len(rec.prompt_ids) + n
    cost = decode_cost(info.cfg, ctx, info.dtype.itemsize)
    decode_ms = sum(s.ms for s in rec.steps[1:])
    tps = (n - 1) / (decode_ms / 1000) if decode_ms > 0 else 0.0
    lines = [
        f"| prompt tokens | time to first token | generated | decode speed | FLOPs / token (at {ctx} ctx) | seed |",
        "|---|---|---|---|---|---|",
        f"| {len(rec.prompt_ids)} | {first.prefill_ms:.0f} ms"
        + (f" (+ {first.wait_ms / 1000:.1f} s queued)" if first.wait_ms and first.wait_ms >= 50 else "")
        + f" | {n} | {tps:.1f} tok/s | "
        f"{si(cost.flops)} ({si(cost.attention_flops)} attention) | {rec.seed} |",
    ]
    if rec.done is not None:
        d = rec.done
        lines.append(f"\nStopped: **{REASONS.get(d.reason, d.reason)}**."
                     + (f" Max new tokens was capped at {d.max_new_tokens} to fit the context "
                        f"window of {info.cfg.max_seq_len}." if d.capped else ""))
    return "\n".join(lines)


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
.tl-att td, .tl-att th, .tl-lens td, .tl-lens th { padding: 1px 5px; border: 1px solid rgba(128,128,128,.2); }
.tl-att { max-height: 480px; overflow: auto; }
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
    head = ("<div class='tl-row tl-head'><span class='tl-tok'>token</span><span class='tl-bar'>final in the run</span>"
            "<span class='tl-num'></span><span class='tl-bar'>final, replayed</span><span class='tl-num'></span></div>")
    return f"<div class='tl-bars'>{head}{''.join(rows)}</div>"


def compare_summary(a: RunRecord, b: RunRecord, at: int | None) -> str:
    sa, sb = run_summary(a), run_summary(b)
    lines = []
    if at is None:
        lines.append("**A and B produced the same tokens.**")
    elif at < min(len(a.steps), len(b.steps)):
        x, y = a.steps[at], b.steps[at]
        lines.append(f"**First divergence at step {at}**: A chose **{html.escape(visible(x.piece))}** "
                     f"(p {prob_html(shown_prob(x))}), B chose **{html.escape(visible(y.piece))}** "
                     f"(p {prob_html(shown_prob(y))}).")
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


def likelihood_table(scores) -> str:
    if not scores:
        return ""
    total = sum(lp for _, _, lp in scores)
    lines = ["| token | id | p | log p |", "|---|---|---|---|"]
    for i, piece, lp in scores:
        lines.append(f"| {html.escape(visible(piece))} | {i} | {fmt_p(math.exp(lp))} | {lp:.3f} |")
    lines.append(f"| **all {len(scores)} tokens** | | {fmt_p(math.exp(total))} | {total:.3f} |")
    return "\n".join(lines)
