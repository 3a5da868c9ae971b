"""What the page's components show, from a run's record and the engine's description: HTML,
Markdown, data frames and CSS. Pure functions, no Gradio."""

from __future__ import annotations

import html

import pandas as pd

from inference.device import dtype_name
from inference.events import StepEvent
from inference.anatomy import decode_cost, memory_table, stages
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


def bucket(p: float) -> str:
    return next(name for threshold, name in BUCKETS if p >= threshold)


def visible(text: str) -> str:
    """Whitespace made visible for token labels: ␣ space, ↵ newline, ⇥ tab, ∅ no text."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") if text else "∅"


def highlighted_output(rec: RunRecord) -> list[tuple[str, str | None]]:
    """One (text, bucket) entry per step, so a click's index is the step number."""
    out = [(s.text, bucket(s.prob)) for s in rec.steps]
    if rec.done and rec.done.tail:
        out.append((rec.done.tail, None))
    return out


def prompt_tokens_view(tokenizer, ids: list[int]) -> list[tuple[str, str]]:
    return [(visible(tokenizer.piece(i)), str(i)) for i in ids]


def bars_html(step: StepEvent | None, title: str = "") -> str:
    """Horizontal bars: raw model probability and final sampling probability per candidate."""
    if step is None:
        return "<div class='tl-bars tl-empty'>Generate to see each step's candidates.</div>"
    rows = []
    for c in step.top:
        chosen = c.id == step.token_id
        label = html.escape(visible(c.piece))
        rows.append(
            f"<div class='tl-row{' tl-chosen' if chosen else ''}'>"
            f"<span class='tl-tok' title='id {c.id}'>{'▶ ' if chosen else ''}{label}</span>"
            f"<span class='tl-bar'><span class='tl-raw' style='width:{100 * c.raw_prob:.2f}%'></span></span>"
            f"<span class='tl-num'>{c.raw_prob:.4f}</span>"
            f"<span class='tl-bar'><span class='tl-final' style='width:{100 * c.prob:.2f}%'></span></span>"
            f"<span class='tl-num'>{c.prob:.4f}</span></div>")
    head = (f"<div class='tl-title'>{html.escape(title or f'Step {step.step}')}: chose "
            f"<b>{html.escape(visible(step.piece))}</b> (id {step.token_id}) with p = {step.prob:.4f} "
            f"(raw {step.raw_prob:.4f})</div>"
            "<div class='tl-row tl-head'><span class='tl-tok'>token</span>"
            "<span class='tl-bar'>raw model probability</span><span class='tl-num'></span>"
            "<span class='tl-bar'>final (sampled from)</span><span class='tl-num'></span></div>")
    return f"<div class='tl-bars'>{head}{''.join(rows)}</div>"


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
    """KV-cache MiB per step: used (prefill jump, then one position per step) and allocated."""
    rows = []
    if rec.steps:  # before prefill the cache is empty: the first step shows the prefill's jump
        rows.append({"step": -1, "MiB": 0.0, "series": "used"})
        rows.append({"step": -1, "MiB": rec.steps[0].kv_cache_capacity_bytes / 2**20, "series": "allocated"})
    for s in rec.steps:
        rows.append({"step": s.step, "MiB": s.kv_cache_bytes / 2**20, "series": "used"})
        rows.append({"step": s.step, "MiB": s.kv_cache_capacity_bytes / 2**20, "series": "allocated"})
    return pd.DataFrame(rows, columns=["step", "MiB", "series"])


def latency_frame(rec: RunRecord) -> pd.DataFrame:
    return pd.DataFrame([{"step": s.step, "ms": s.ms} for s in rec.steps[1:]], columns=["step", "ms"])


def kv_formula(info, tokens: int | None = None) -> str:
    cfg = info.cfg
    b = info.dtype.itemsize
    per = cfg.kv_bytes_per_token(b)
    text = (f"**KV cache** = 2 × layers × KV heads × head dim × bytes per value × tokens = "
            f"2 × {cfg.n_layers} × {cfg.n_kv_heads} × {cfg.head_dim} × {b} × tokens = "
            f"**{per:,} bytes per token**")
    if tokens:
        text += f"; × {tokens} tokens = {per * tokens / 2**20:.2f} MiB"
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
            f"(2 × matmul parameters + attention)")


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
        f"| {len(rec.prompt_ids)} | {first.prefill_ms:.0f} ms | {n} | {tps:.1f} tok/s | "
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
    cfg, b = info.cfg, info.dtype.itemsize
    ctx = n_prompt + step
    pre = stages(cfg, n_prompt, n_prompt, b)
    dec = stages(cfg, 1, ctx, b)
    lines = [f"Prefill: {n_prompt} prompt tokens at once. Decode step {step}: 1 token attending to "
             f"{ctx} positions. Bytes are weights and KV cache read at {dtype_name(info.dtype)}.", "",
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
        cells = "".join(f"<td>{html.escape(visible(tokenizer.piece(i)))} <small>{p:.3f}</small></td>"
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
    for s in rec.steps:
        rows.append({"step": s.step, "value": s.prob, "metric": "chosen-token probability"})
        rows.append({"step": s.step, "value": s.entropy, "metric": "raw entropy (nats)"})
    ranks = pd.DataFrame([{"step": s.step, "rank": s.rank} for s in rec.steps], columns=["step", "rank"])
    return pd.DataFrame(rows, columns=["step", "value", "metric"]), ranks


def stages_table(original, replayed, tokenizer, chosen: int) -> str:
    lines = [f"Chosen token: **{html.escape(visible(tokenizer.piece(chosen)))}** (id {chosen}).", "",
             "| stage | kept (run) | mass removed (run) | chosen rank, p (run) | kept (replay) | "
             "mass removed (replay) | chosen rank, p (replay) |", "|---|---|---|---|---|---|---|"]

    def rank(st):
        return "removed" if st.chosen_rank is None else f"#{st.chosen_rank}, {st.chosen_prob:.4f}"

    for a, b in zip(original, replayed):
        lines.append(f"| {a.name} | {a.kept:,} | {a.mass_removed:.4f} | {rank(a)} | {b.kept:,} | "
                     f"{b.mass_removed:.4f} | {rank(b)} |")
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
            f"<span class='tl-num'>{float(final_run[i]):.4f}</span>"
            f"<span class='tl-bar'><span class='tl-final' style='width:{100 * float(final_replay[i]):.2f}%'></span></span>"
            f"<span class='tl-num'>{float(final_replay[i]):.4f}</span></div>")
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
                     f"(p {x.prob:.4f}), B chose **{html.escape(visible(y.piece))}** (p {y.prob:.4f}).")
    else:
        lines.append(f"**Same tokens until step {at}, where one run stopped.**")
    lines += ["", "| run | tokens | mean chosen-token p | mean raw entropy (nats) | perplexity of its text |",
              "|---|---|---|---|---|"]
    for name, s in (("A", sa), ("B", sb)):
        lines.append(f"| {name} | {s['tokens']} | {s['mean_p']:.4f} | {s['mean_entropy']:.3f} | {s['perplexity']:.3f} |")
    return "\n".join(lines)


def highlighted_with_marker(rec: RunRecord, at: int | None) -> list[tuple[str, str | None]]:
    out = [(s.text, "diverges here" if i == at else bucket(s.prob)) for i, s in enumerate(rec.steps)]
    if rec.done and rec.done.tail:
        out.append((rec.done.tail, None))
    return out


def likelihood_table(scores) -> str:
    import math
    if not scores:
        return ""
    total = sum(lp for _, _, lp in scores)
    lines = ["| token | id | p | log p |", "|---|---|---|---|"]
    for i, piece, lp in scores:
        lines.append(f"| {html.escape(visible(piece))} | {i} | {math.exp(lp):.4g} | {lp:.3f} |")
    lines.append(f"| **all {len(scores)} tokens** | | {math.exp(total):.4g} | {total:.3f} |")
    return "\n".join(lines)
