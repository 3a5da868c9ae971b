"""What "Inside one token" shows: the stages of the path with their shapes and costs, the new
token's attention, the full attention pattern of one head, the logit lens, and the parameters
and bytes per component. Pure functions, no Gradio."""

from __future__ import annotations

import html

from inference.device import dtype_name
from inference.model.anatomy import family_path, memory_table, stages
from ui.format import NO_CONFIG, NOT_HERE, binary_size, prob_html, si, token_label

INSIDE_NOTE = (f"**Inside one token**: the path through the layers, the attention weights and the "
               f"logit lens need the model's weights and activations: {NOT_HERE}, which returns "
               "only tokens and the log-probabilities of the top candidates.")


def stages_markdown(info, n_prompt: int, step: int, n_given: int = 0) -> str:
    """The path of one token: prefill over the prompt (and a branch's given tokens, read with it)
    and the selected decode step side by side."""
    cfg, b, b_dec = info.cfg, info.dtype.itemsize, info.decode_dtype.itemsize
    n_pre = n_prompt + n_given  # the engine prefills the given tokens with the prompt
    ctx = n_pre + step
    stored = getattr(info, "stored_bytes", None)
    pre = stages(cfg, n_pre, n_pre, b)
    dec = stages(cfg, 1, ctx, b_dec, b, stored)
    read = f"{n_prompt} prompt + {n_given} given = {n_pre} tokens" if n_given else f"{n_prompt} prompt tokens"
    if stored:
        weights = (f"Decode bytes are the weights read as the GGUF file's quantized blocks (a per-layer row: "
                   f"the layers' average; {binary_size(stages(cfg, 1, ctx, 4, b)[-1].bytes)} a token at float32)")
    else:
        weights = f"Decode bytes are the weights read at {dtype_name(info.decode_dtype)}"
    lines = ["**This model's path**: " + " → ".join(family_path(cfg)) + ".", "",
             f"Prefill: {read} at once. Decode step {step}: 1 token attending to "
             f"{ctx} positions. {weights} and the KV cache at {dtype_name(info.dtype)}.", "",
             "| stage | prefill shape | prefill FLOPs | decode shape | decode FLOPs | decode bytes |",
             "|---|---|---|---|---|---|"]
    for p, d in zip(pre, dec):
        lines.append(f"| {p.name} | {p.shape} | {si(p.flops)} | {d.shape} | {si(d.flops)} | {binary_size(d.bytes)} |")
    lines.append(f"| **per token** | | {si(pre[-1].flops / n_pre)} | | {si(dec[-1].flops)} | "
                 f"{binary_size(dec[-1].bytes)} |")
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
        label = html.escape(token_label(tokenizer.piece(capture.context_ids[pos])))
        rows.append(f"<tr><th class='tl-pos'>{pos}</th><th class='tl-ctx'>{label}</th>{cells}</tr>")
    note = f"<div>showing the last {max_rows} of {T} positions</div>" if start else ""
    # The title outside the box that scrolls; the token column stays in view as it scrolls (page.css).
    return (f"<div class='tl-att-view'><div class='tl-title'>Layer {capture.layer}: where the new token's "
            f"query looked (each head's column of weights sums to 1; cell shade ∝ √weight)</div>{note}"
            f"<div class='tl-att'><table><tr><th class='tl-pos'>pos</th><th class='tl-ctx'>token</th>{head}</tr>"
            f"{''.join(rows)}</table></div></div>")


def pattern_html(pattern, context_ids: list[int], tokenizer, layer: int, head: int, max_positions: int = 96) -> str:
    """The full causal attention pattern of one head: a row per query position, a column per key
    position, shade ∝ √weight; hovering a cell names both tokens (PATTERN_JS)."""
    n_heads, T, _ = pattern.shape
    head = min(max(int(head), 0), n_heads - 1)
    start = max(0, T - max_positions)
    w = pattern[head, start:, start:]
    labels = [html.escape(token_label(tokenizer.piece(i))) for i in context_ids[start:T]]
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
        cells = "".join(f"<td>{html.escape(token_label(tokenizer.piece(i)))} <small>{prob_html(p)}</small></td>"
                        for i, p in top)
        rows.append(f"<tr><th>after layer {layer}</th>{cells}</tr>")
    return ("<div class='tl-title'>Logit lens: the top tokens each layer's residual stream would "
            "predict</div><div class='tl-lens'><table>" + "".join(rows) + "</table></div>")


def memory_markdown(info) -> str:
    """Parameters and bytes per component; parameters only where the weights' dtype is not
    known here (a server's is its own)."""
    if info.dtype is None:
        return _parameters_only(info)
    cfg, b = info.cfg, info.dtype.itemsize
    lines = [f"| component | parameters | bytes at {dtype_name(info.dtype)} |", "|---|---|---|"]
    for name, n, nbytes in memory_table(cfg, b):
        lines.append(f"| {name} | {n:,} | {binary_size(nbytes)} |")
    head = cfg.vocab_size * cfg.hidden_size
    if cfg.tie_word_embeddings:
        lines.append(f"\nThe LM head **shares the embedding matrix** (tied): that saves {head:,} "
                     f"parameters, {binary_size(head * b)} ({100 * head / (cfg.param_counts()['total'] + head):.0f}% "
                     "of an untied model).")
    else:
        lines.append(f"\nThe LM head has its own matrix (untied): {head:,} parameters, {binary_size(head * b)}.")
    return "\n".join(lines)


def _parameters_only(info) -> str:
    """Parameters per component, from the config (no bytes: the server's dtype is its own)."""
    cfg = info.cfg
    if cfg is None:
        return NO_CONFIG
    lines = ["| component | parameters |", "|---|---|"]
    for name, n, _ in memory_table(cfg, 1):
        lines.append(f"| {name} | {n:,} |")
    return "\n".join(lines)
