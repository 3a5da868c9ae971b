"""Inside one token: the stages of the path with their shapes and costs, and captures of what
the model did at one step (attention weights, the logit lens). Captures re-run the step's
forward pass on demand, so generation itself never pays for them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.model.config import ModelConfig
from inference.model.transformer import Probe, Transformer


@dataclass(frozen=True)
class Stage:
    name: str
    shape: str
    flops: int  # multiply-adds count 2
    bytes: int  # weights and KV cache read


def stages(cfg: ModelConfig, T: int, T_ctx: int, bytes_per_value: int,
           kv_bytes_per_value: int | None = None, stored: dict[str, int] | None = None) -> list[Stage]:
    """The path of T new tokens that attend to T_ctx positions (prefill: T = T_ctx = prompt
    length; a decode step: T = 1). Attention is counted over the full T x T_ctx rectangle.
    Weights are read at bytes_per_value, the KV cache at kv_bytes_per_value (default the same);
    with `stored` (Transformer.stored_bytes: a GGUF file's blocks) the matrices are read as
    stored: a per-layer stage then shows the layers' average, the totals are exact."""
    h, L, b = cfg.hidden_size, cfg.n_layers, bytes_per_value
    kv_b = b if kv_bytes_per_value is None else kv_bytes_per_value
    stored = stored or {}
    mats = {"qkv": L * h * (cfg.q_dim + 2 * cfg.kv_dim) * b, "out": L * cfg.q_dim * h * b,
            "ffn": L * 3 * h * cfg.intermediate_size * b, "head": cfg.vocab_size * h * b, "embed_row": h * b}
    mats.update(stored)
    qkv = Stage("Q, K, V projections + RoPE (per layer)",
                f"Q [{T}, {cfg.n_heads}, {cfg.head_dim}], K and V [{T}, {cfg.n_kv_heads}, {cfg.head_dim}]",
                2 * T * h * (cfg.q_dim + 2 * cfg.kv_dim), mats["qkv"] // L)
    scores = Stage("attention softmax(QKᵀ/√d)·V, causal (per layer)",
                   f"scores [{cfg.n_heads}, {T}, {T_ctx}]",
                   2 * 2 * cfg.n_heads * T * T_ctx * cfg.head_dim, 2 * T_ctx * cfg.kv_dim * kv_b)
    out = Stage("attention output projection (per layer)", f"[{T}, {h}]", 2 * T * cfg.q_dim * h,
                mats["out"] // L)
    glu = "SwiGLU" if cfg.activation == "silu" else "GeGLU"
    ffn = Stage(f"{glu} feed-forward (per layer)", f"gate, up [{T}, {cfg.intermediate_size}] → [{T}, {h}]",
                2 * T * 3 * h * cfg.intermediate_size, mats["ffn"] // L)
    n = 2 * cfg.pre_norms + 2 * cfg.post_norms  # Gemma norms each branch's input and output, OLMo 2 its output
    norms = Stage(f"{n} × RMSNorm + residuals (per layer)", f"[{T}, {h}]", n * 4 * T * h, n * h * b)
    layer = [qkv, scores, out, ffn, norms]
    attn_layer = Stage("attention, one layer", "", qkv.flops + scores.flops + out.flops,
                       qkv.bytes + scores.bytes + out.bytes)
    all_layers = Stage(f"all {L} layers", f"[{T}, {h}]", L * sum(s.flops for s in layer),
                       mats["qkv"] + mats["out"] + mats["ffn"] + L * (scores.bytes + norms.bytes))
    head = Stage("final RMSNorm + LM head (last position)", f"final hidden [{h}] → logits [{cfg.vocab_size}]",
                 2 * h * cfg.vocab_size + 4 * h, mats["head"] + h * b)
    first = [Stage("token ids", f"[{T}]", 0, 0),
             Stage("embedding lookup", f"[{T}, {h}]", 0, T * mats["embed_row"])]
    total = Stage("total for this pass", "", all_layers.flops + head.flops,
                  sum(s.bytes for s in first) + all_layers.bytes + head.bytes)
    return first + layer + [attn_layer, Stage("feed-forward, one layer", "", ffn.flops, ffn.bytes),
                            all_layers, head, total]


def family_path(cfg: ModelConfig) -> list[str]:
    """The turns this model's family takes on the one path, in the order a token meets them."""
    scale = f" × {cfg.embed_scale:.4g}" + (" (√hidden)" if cfg.norm_unit_offset else "") if cfg.embed_scale != 1 else ""
    turns = [f"{cfg.family}: embedding lookup{scale}"]
    norm = "RMSNorm (1 + w)" if cfg.norm_unit_offset else "RMSNorm"
    if cfg.pre_norms:
        turns.append(f"per layer: {norm} before attention and before the MLP"
                     + (", and after each (four a layer)" if cfg.post_norms else ""))
    else:
        turns.append(f"per layer: no norm before attention or the MLP; {norm} after each, before its residual add")
    attn = "Q, K, V projections" + (" with biases" if cfg.qkv_bias else "")
    if cfg.qk_norm:
        attn += ", an RMSNorm over each head's q and k"
    if cfg.qk_norm_full:
        attn += ", an RMSNorm over the whole q and the whole k"
    attn += f", RoPE θ {cfg.rope_theta:g}"
    if cfg.local_rope_theta:
        attn += f" (sliding layers θ {cfg.local_rope_theta:g})"
    if cfg.partial_rotary_dim:
        attn += f" on each head's first {cfg.rotary_dim} of {cfg.head_dim} dims"
    if cfg.rope_scaling.rope_type != "default":
        kind = cfg.rope_scaling.rope_type
        attn += (", the file's per-frequency RoPE factors" if kind == "factors" else
                 f", LongRoPE's short factors (the context capped at the original {cfg.max_seq_len:,})"
                 if kind == "longrope" else f", {kind} scaling")
    if cfg.nope_layers:
        attn += f" (layers {_ranges(list(cfg.nope_layers))} apply no RoPE)"
    attn += (f"; {cfg.n_heads} query heads share {cfg.n_kv_heads} KV heads" if cfg.n_rep > 1 else "")
    attn += (f"; scores scaled by {cfg.attention_multiplier:g}" if cfg.attention_multiplier is not None
             else f"; scores scaled by {cfg.query_pre_attn_scalar or cfg.head_dim:g}^-0.5")
    if cfg.attn_logit_softcap:
        attn += f", then soft-capped: {cfg.attn_logit_softcap:g} · tanh(scores / {cfg.attn_logit_softcap:g})"
    turns.append(attn)
    sliding = [i for i, t in enumerate(cfg.layer_types) if t == "sliding"] if cfg.sliding_window else []
    if sliding:
        full = [i for i in range(cfg.n_layers) if i not in sliding]
        turns.append(f"causal mask; layers {_ranges(sliding)} see only the last {cfg.sliding_window:,} "
                     f"positions (a sliding window), layers {_ranges(full) or 'none'} see all")
    else:
        turns.append("causal mask; every layer sees every earlier position")
    turns.append(("SwiGLU: silu(gate) × up" if cfg.activation == "silu" else "GeGLU: gelu_tanh(gate) × up")
                 + " → down projection")
    if cfg.residual_multiplier != 1:
        turns.append(f"each branch's output × {cfg.residual_multiplier:g} before the residual add")
    turns.append("final RMSNorm → LM head" + (" (tied to the embedding)" if cfg.tie_word_embeddings else "")
                 + (f" → logits / {cfg.logit_scale:g}" if cfg.logit_scale != 1 else "")
                 + (f" → {cfg.final_logit_softcap:g} · tanh(logits / {cfg.final_logit_softcap:g})"
                    if cfg.final_logit_softcap else ""))
    return turns


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 4] -> "0–2, 4"."""
    out, start = [], None
    for i, n in enumerate(layers):
        if start is None:
            start = n
        if i + 1 == len(layers) or layers[i + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}–{n}")
            start = None
    return ", ".join(out)


# LLaMA-7B's shapes (Touvron et al. 2023): the model most tutorials count FLOPs on, put through
# the same counter as the loaded model.
LLAMA_7B = ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, n_layers=32,
                       n_heads=32, n_kv_heads=32, max_seq_len=2048, rms_norm_eps=1e-6)


@dataclass(frozen=True)
class Component:
    name: str
    flops: int
    bytes: int


def per_token(cfg: ModelConfig, context_len: int, bytes_per_value: int,
              kv_bytes_per_value: int | None = None, stored: dict[str, int] | None = None) -> list[Component]:
    """One new token attending to `context_len` positions, by component over all layers (the
    rows of `stages`, regrouped): attention projections, attention scores, MLP, norms, LM head,
    and their total (equal to `stages`' total)."""
    rows = {r.name: r for r in stages(cfg, 1, context_len, bytes_per_value, kv_bytes_per_value, stored)}
    L, h = cfg.n_layers, cfg.hidden_size
    qkv = rows["Q, K, V projections + RoPE (per layer)"]
    out = rows["attention output projection (per layer)"]
    scores = rows["attention softmax(QKᵀ/√d)·V, causal (per layer)"]
    ffn = next(r for r in rows.values() if r.name.endswith("feed-forward (per layer)"))
    norms = next(r for r in rows.values() if r.name.endswith("RMSNorm + residuals (per layer)"))
    head = rows["final RMSNorm + LM head (last position)"]
    embed = rows["embedding lookup"]
    total = rows["total for this pass"]
    parts = [Component("attention projections (Q, K, V, output)", L * (qkv.flops + out.flops), L * (qkv.bytes + out.bytes)),
             Component("attention scores (QKᵀ and × V over the context)", L * scores.flops, L * scores.bytes),
             Component("MLP (gate, up, down)", L * ffn.flops, L * ffn.bytes),
             Component("norms and residuals", L * norms.flops + 4 * h, L * norms.bytes + h * bytes_per_value),
             Component("LM head", head.flops - 4 * h, head.bytes - h * bytes_per_value),
             Component("embedding lookup", 0, embed.bytes)]
    assert sum(c.flops for c in parts) == total.flops and sum(c.bytes for c in parts) == total.bytes
    return parts + [Component("total", total.flops, total.bytes)]


@dataclass(frozen=True)
class TokenCost:
    flops: int
    attention_flops: int  # QK^T and attention x V over the context, all layers
    bytes: int  # weights and KV cache read


def decode_cost(cfg: ModelConfig, context_len: int, bytes_per_value: int,
                kv_bytes_per_value: int | None = None, stored: dict[str, int] | None = None) -> TokenCost:
    """One new token attending to `context_len` positions: the totals of its stages."""
    rows = stages(cfg, 1, context_len, bytes_per_value, kv_bytes_per_value, stored)
    attention = next(r for r in rows if r.name.startswith("attention softmax"))
    return TokenCost(rows[-1].flops, cfg.n_layers * attention.flops, rows[-1].bytes)


@dataclass
class StepCapture:
    """What the model did when it predicted one step's token."""
    context_ids: list[int]  # the positions the step attended to
    layer: int
    attention: torch.Tensor  # (n_heads, T_ctx), float32 on the CPU; rows sum to 1
    lens: list[list[tuple[int, float]]]  # per layer: top (token id, probability)
    probs: torch.Tensor  # the model's own next-token distribution (vocab,)


@torch.inference_mode()
def capture_step(model: Transformer, context_ids: list[int], layer: int, top: int = 5) -> StepCapture:
    """Re-run the forward pass that predicted the token after context_ids, capturing the
    attention of the last position in `layer` and every layer's residual for the logit lens."""
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer must be in 0..{model.cfg.n_layers - 1}, got {layer}")
    probe = Probe(attention_layers=(layer,), logit_lens=True)
    tokens = torch.tensor([context_ids], device=model.device)
    logits = model(tokens, model.new_cache(len(context_ids)), 0, probe=probe)[0]
    lens = []
    for residual in probe.residuals:
        p = model.lens_logits(residual).softmax(-1)
        values, ids = p.topk(top)
        lens.append(list(zip(ids.tolist(), values.tolist())))
    return StepCapture(context_ids, layer, probe.attention[layer].float().cpu(), lens,
                       logits.softmax(-1).cpu())


@torch.inference_mode()
def capture_pattern(model: Transformer, context_ids: list[int], layer: int) -> torch.Tensor:
    """The full causal attention pattern of `layer` over context_ids, (heads, T, T) float32 on
    the CPU: row i holds query position i's weights over positions 0..i (zero after)."""
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer must be in 0..{model.cfg.n_layers - 1}, got {layer}")
    probe = Probe(pattern_layers=(layer,))
    tokens = torch.tensor([context_ids], device=model.device)
    model(tokens, model.new_cache(len(context_ids)), 0, probe=probe)
    return probe.patterns[layer].float().cpu()


def memory_table(cfg: ModelConfig, bytes_per_value: int) -> list[tuple[str, int, int]]:
    """(component, parameters, bytes) for the loaded model."""
    p = cfg.param_counts()
    return [(name, p[key], p[key] * bytes_per_value) for name, key in (
        ("embedding", "embedding"), ("attention (all layers)", "attention"),
        ("feed-forward (all layers)", "ffn"), ("norms", "norms"), ("LM head", "lm_head"),
        ("total", "total"))]
