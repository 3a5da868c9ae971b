"""The model card: the model's name, family and every turn of its path, shapes, size, the GGUF
file's types and bytes, and where it runs; in front of a server, which distribution its
log-probabilities are. Pure functions of the engine's description (contract.EngineInfo)."""

from __future__ import annotations

import html

from inference.device import dtype_name
from inference.model.anatomy import decode_cost
from inference.model.family_spec import FEATURES, SPECS
from ui.format import approx_note, binary_size, si

# Which distribution a server's log-probabilities are (contract.Capabilities.logprobs).
LOGPROBS = {
    "raw": "the model's own distribution (vLLM's default --logprobs-mode raw_logprobs)",
    "processed": "the distribution after the sampling settings (--logprobs-mode processed_logprobs)",
}
NO_CONFIG = ("The served model's shapes are not known here: start the page with "
             "`--engine-config PATH` (its config.json, or a local copy of the model) for them and "
             "the KV-cache formula.")



def model_card(info) -> str:
    """The model's name, shapes, size and where it runs; in front of a server, which
    distribution its log-probabilities are."""
    return _local_card(info) if info.capabilities.internals else _served_card(info)


def _local_card(info) -> str:
    cfg = info.cfg
    params = cfg.param_counts()
    cost = decode_cost(cfg, 1, info.dtype.itemsize)
    return (f"**{html.escape(info.name)}** · {cfg.n_layers} layers · hidden {cfg.hidden_size} · "
            f"{cfg.n_heads} heads / {cfg.n_kv_heads} KV heads · head dim {cfg.head_dim} · "
            f"FFN {cfg.intermediate_size} · vocab {cfg.vocab_size:,} · context {cfg.max_seq_len:,} · "
            f"RoPE θ {cfg.rope_theta:g}{'' if cfg.rope_scaling.rope_type == 'default' else ' (' + cfg.rope_scaling.rope_type + ' scaling)'}"
            f"{sliding_text(cfg)} · {'tied' if cfg.tie_word_embeddings else 'untied'} LM head  \n"
            f"**{params['total'] / 1e6:.1f} M parameters** · {dtype_name(info.dtype)}"
            f"{'' if info.decode_dtype == info.dtype else ' (decode matmuls in ' + dtype_name(info.decode_dtype) + ')'}"
            f"{blocks_text(info)} on "
            f"{info.where} · ≈ {si(cost.flops, 'FLOPs')} per token at a 1-token context "
            f"(2 × matmul parameters + attention) · every probability on this page is computed at "
            f"{dtype_name(info.decode_dtype)}"
            + f"  \n{family_text(cfg)}{file_text(info)}"
            + (f"  \n⚠ {approx_note(info)}" if info.decode_error else ""))


def family_text(cfg) -> str:
    """The family and every turn of its path a token takes (family_spec.FEATURES' words)."""
    spec = SPECS[cfg.family]
    turns = "; ".join(FEATURES[f] for f in sorted(cfg.features()))
    return (f"**family {spec.name}** ({spec.example}) · " + (f"its turns: {turns}" if turns
            else "the plain LLaMA path: pre-norms, SwiGLU, RoPE on every layer"))


def file_text(info) -> str:
    """" · GGUF file: Q4_K 60.2 MiB, Q6_K 9.8 MiB, ..." for a model read from a GGUF file."""
    types = getattr(info, "file_types", None)
    if not types:
        return ""
    parts = ", ".join(f"{t} {binary_size(n)}" for t, n in sorted(types.items(), key=lambda kv: -kv[1]))
    return f"  \n**GGUF file** {binary_size(sum(types.values()))}: {parts}"


def blocks_text(info) -> str:
    """" (matrices in the GGUF file's quantized blocks, N MiB)" for a model computing on them."""
    stored = getattr(info, "stored_bytes", None)
    if not stored:
        return ""
    size = sum(v for k, v in stored.items() if k != "embed_row")
    products = getattr(info, "products", None) or {}
    how = ("products in integers: each block of 32 activations in four int8 slices, exact integer sums, "
           "the scales applied in float32, within a stated bound of the float32 product"
           if products.get("path") == "integer" else "activations and sums float32")
    return f" (matrices read in the GGUF file's quantized blocks, {binary_size(size)}; {how})"


def sliding_text(cfg) -> str:
    """" · sliding window W on k of n layers (...)" for a model whose layers see only the last W
    positions, else "": what the card must say, since it bounds what a token attends to."""
    sliding = [i for i in range(cfg.n_layers) if cfg.is_sliding(i)]
    if not sliding:
        return ""
    full = [i for i in range(cfg.n_layers) if i not in sliding]
    local = f"; their RoPE θ {cfg.local_rope_theta:g}" if cfg.local_rope_theta is not None else ""
    return (f" · sliding window {cfg.sliding_window:,} on {len(sliding)} of {cfg.n_layers} layers "
            f"(full attention: {'layer' if len(full) == 1 else 'layers'} {', '.join(map(str, full)) or 'none'}{local})")


def _served_card(info) -> str:
    head = (f"**{html.escape(info.name)}** served by vLLM at `{html.escape(info.where)}` · context "
            f"{info.max_seq_len:,} tokens (the server's) · log-probabilities: {LOGPROBS[info.capabilities.logprobs]}, "
            f"{info.logprobs_source}")
    cfg = info.cfg
    if cfg is None:
        return head + "  \n" + NO_CONFIG
    params = cfg.param_counts()
    return (head + "  \n"
            f"{cfg.n_layers} layers · hidden {cfg.hidden_size} · {cfg.n_heads} heads / {cfg.n_kv_heads} "
            f"KV heads · head dim {cfg.head_dim} · FFN {cfg.intermediate_size} · vocab {cfg.vocab_size:,}{sliding_text(cfg)} · "
            f"**{params['total'] / 1e6:.1f} M parameters** · ≈ {si(decode_cost(cfg, 1, 2).flops, 'FLOPs')} per "
            f"token at a 1-token context (from `{html.escape(info.config_source)}`)")
