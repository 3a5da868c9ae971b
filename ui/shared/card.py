"""The model card: the model's name, family and every turn of its path, shapes, size, the GGUF
file's types and bytes, and where it runs (in front of a server, which
distribution its log-probabilities are), each term marked with its definition (ui/glossary).
Pure functions of the engine's EngineInfo."""

from __future__ import annotations

import html

from inference.device import dtype_name
from inference.model.anatomy import decode_cost
from inference.model.family_spec import FEATURES, SPECS
from ui.format import LOGPROBS, NO_CONFIG, approx_note, binary_size, count, si
from ui.glossary import gloss


def model_card(info) -> str:
    """The model's name, shapes, size and where it runs; in front of a server, which
    distribution its log-probabilities are. Each term marked with its definition (ui/glossary)."""
    return gloss(_local_card(info) if info.capabilities.internals else _served_card(info))


def _local_card(info) -> str:
    """The shapes, then the size and where it runs; folded below them, so that the card leaves the
    prompt and Generate in a phone's first screen: the cost per token, the family's turns, the
    GGUF file's types and how its products are computed."""
    cfg = info.cfg
    params = cfg.param_counts()
    cost = decode_cost(cfg, 1, info.dtype.itemsize)
    more = [line for line in (
        f"≈ {si(cost.flops, 'FLOPs')} per token at a 1-token context (2 × matmul parameters + attention) · "
        f"every probability on this page is computed at {dtype_name(info.decode_dtype)}",
        family_text(cfg), file_text(info), blocks_text(info)) if line]
    return (f"**{html.escape(info.name)}** · {count(cfg.n_layers, 'layer')} · hidden {cfg.hidden_size} · "
            f"{count(cfg.n_heads, 'head')} / {count(cfg.n_kv_heads, 'KV head')} · head dim {cfg.head_dim} · "
            f"FFN {cfg.intermediate_size} · vocab {cfg.vocab_size:,} · context {cfg.max_seq_len:,} · "
            f"{rope_text(cfg)}{sliding_text(cfg)} · {'tied' if cfg.tie_word_embeddings else 'untied'} LM head  \n"
            f"**{params['total'] / 1e6:.1f} M parameters** · {dtype_name(info.dtype)}"
            f"{'' if info.decode_dtype == info.dtype else ' (decode matmuls in ' + dtype_name(info.decode_dtype) + ')'}"
            f"{' in quantized blocks' if getattr(info, 'stored_bytes', None) else ''} on {info.where}"
            + (f"  \n⚠ {approx_note(info)}" if info.decode_error else "")
            + f"\n\n<details class='tl-card-more'><summary>Its cost, family, file and products</summary>"
              f"{'<br>'.join(more)}</details>")


def family_text(cfg) -> str:
    """The family and every turn of its path a token takes (family_spec.FEATURES' words)."""
    spec = SPECS[cfg.family]
    turns = "; ".join(FEATURES[f] for f in sorted(cfg.features()))
    return (f"<b>family {spec.name}</b> ({spec.example}) · " + (f"its turns: {turns}" if turns
            else "the plain LLaMA path: pre-norms, SwiGLU, RoPE on every layer"))


def file_text(info) -> str:
    """" · GGUF file: Q4_K 60.2 MiB, Q6_K 9.8 MiB, ..." for a model read from a GGUF file."""
    types = getattr(info, "file_types", None)
    if not types:
        return ""
    parts = ", ".join(f"{t} {binary_size(n)}" for t, n in sorted(types.items(), key=lambda kv: -kv[1]))
    return f"<b>GGUF file</b> {binary_size(sum(types.values()))}: {parts}"


def blocks_text(info) -> str:
    """"Products: matrices read in the GGUF file's quantized blocks, N MiB; how" for a model
    computing on them."""
    stored = getattr(info, "stored_bytes", None)
    if not stored:
        return ""
    size = sum(v for k, v in stored.items() if k != "embed_row")
    products = getattr(info, "products", None) or {}
    how = ("products in integers: each block of 32 activations in three int8 slices, exact integer sums, "
           "the scales applied in float32, within a stated bound of the float32 product"
           if products.get("path") == "integer" else "activations and sums float32")
    return f"<b>Products</b>: matrices read in the GGUF file's quantized blocks, {binary_size(size)}; {how}"


def _theta(t: float) -> str:
    return f"{t:,.0f}" if float(t).is_integer() else f"{t:g}"


def rope_text(cfg) -> str:
    """"RoPE θ B" (and its scaling); where the sliding-window layers have a base of their own
    (Gemma 3: 10,000, the full-attention layers 1,000,000), each base with its layers."""
    scaling = '' if cfg.rope_scaling.rope_type == 'default' else f" ({cfg.rope_scaling.rope_type} scaling)"
    sliding = [i for i in range(cfg.n_layers) if cfg.is_sliding(i)]
    if cfg.local_rope_theta is None or not sliding:
        return f"RoPE θ {_theta(cfg.rope_theta)}{scaling}"
    full = cfg.n_layers - len(sliding)
    return (f"RoPE θ {_theta(cfg.rope_theta)} on the full-attention {'layer' if full == 1 else 'layers'}{scaling}, "
            f"{_theta(cfg.local_rope_theta)} on the sliding ones")


def sliding_text(cfg) -> str:
    """" · sliding window W on k of n layers (...)" for a model whose layers see only the last W
    positions, else "": what the card must say, since it bounds what a token attends to."""
    sliding = [i for i in range(cfg.n_layers) if cfg.is_sliding(i)]
    if not sliding:
        return ""
    full = [i for i in range(cfg.n_layers) if i not in sliding]
    return (f" · sliding window {cfg.sliding_window:,} on {len(sliding)} of {cfg.n_layers} layers "
            f"(full attention: {'layer' if len(full) == 1 else 'layers'} {', '.join(map(str, full)) or 'none'})")


def _served_card(info) -> str:
    head = (f"**{html.escape(info.name)}** served by vLLM at `{html.escape(info.where)}` · context "
            f"{info.max_seq_len:,} tokens (the server's) · log-probabilities: {LOGPROBS[info.capabilities.logprobs]}, "
            f"{info.logprobs_source}")
    cfg = info.cfg
    if cfg is None:
        return head + "  \n" + NO_CONFIG
    params = cfg.param_counts()
    return (head + "  \n"
            f"{count(cfg.n_layers, 'layer')} · hidden {cfg.hidden_size} · {count(cfg.n_heads, 'head')} / "
            f"{count(cfg.n_kv_heads, 'KV head')} · head dim {cfg.head_dim} · FFN {cfg.intermediate_size} · vocab {cfg.vocab_size:,}{sliding_text(cfg)} · "
            f"**{params['total'] / 1e6:.1f} M parameters** · ≈ {si(decode_cost(cfg, 1, 2).flops, 'FLOPs')} per "
            f"token at a 1-token context (from `{html.escape(info.config_source)}`)")
