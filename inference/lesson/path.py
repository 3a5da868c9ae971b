"""Chapters 2 to 5: the token's path through the model, with this prompt's numbers: the
embedding lookup, RoPE, one layer's shapes (and the causal mask as the prompt's own matrix),
and the LM head's top logits."""

from __future__ import annotations

import torch

from inference.model.anatomy import family_path, stages
from inference.model.config import ModelConfig
from inference.model.rope import apply_rope, rope_inv_freq, rope_tables

FIRST_VALUES = 8  # of an embedding row, shown
SHIFTS = (0, 1, 10, 100, 1000)  # positions the RoPE pair is moved by, the distance kept
OTHER_DISTANCES = (0, 1, 4, 64)  # the same pair at these distances, for contrast
MATRIX_MAX = 48  # positions of the causal mask drawn in full


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def blocks_name(types: list[str]) -> str:
    """A quantized weight's storage in words: "Q8_0 blocks", "Q4_K and Q6_K blocks"."""
    return " and ".join(sorted(set(types))) + " blocks"


def embed(model, tokenizer, ids: list[int]) -> dict:
    """Each id's row of the embedding matrix (as the layers get it: scaled where the family scales)."""
    cfg: ModelConfig = model.cfg
    rows = model.embed(torch.tensor(ids, device=model.device)).float().cpu()  # (T, hidden)
    params = cfg.vocab_size * cfg.hidden_size
    q = getattr(model.tok_embeddings, "qweight", None)  # a GGUF file's blocks, where the model keeps them
    if q is not None:
        dtype, nbytes = blocks_name(q.types()), q.nbytes
    else:
        w = model.tok_embeddings.weight  # (vocab, hidden)
        dtype, nbytes = _dtype_name(w.dtype), params * w.element_size()
    return {"shape": [cfg.vocab_size, cfg.hidden_size], "dtype": dtype, "bytes_per_value": nbytes / params,
            "params": params, "bytes": nbytes,
            "embed_scale": cfg.embed_scale, "output_shape": [len(ids), cfg.hidden_size],
            "rows": [{"position": p, "id": i, "piece": tokenizer.piece(i),
                      "first_values": [round(v, 6) for v in rows[p, :FIRST_VALUES].tolist()],
                      "norm": float(rows[p].norm())} for p, i in enumerate(ids)]}


def rope(model, ids: list[int]) -> dict:
    """The rotation angles of three of layer 0's dimension pairs at each prompt position, and
    one real query/key pair of layer 0 (the last token's query, the first token's key, head 0)
    scored at positions moved together: the score depends only on their distance."""
    cfg: ModelConfig = model.cfg
    local = cfg.is_sliding(0) and cfg.local_rope_theta is not None
    inv = rope_inv_freq(cfg, local).double()  # (rotary_dim / 2,): dim i pairs with i + rotary_dim / 2
    half = cfg.rotary_dim // 2
    pairs = sorted({0, half // 2, half - 1})
    n = len(ids)
    angles = [{"pair": i, "dims": [i, i + half], "radians_per_position": float(inv[i]),
               "wavelength_positions": float(2 * torch.pi / inv[i]),
               "radians": [float(p * inv[i]) for p in range(n)]} for i in pairs]
    q, k = _layer0_qk(model, ids)
    shifts = [s for s in SHIFTS if n - 1 + s < cfg.max_seq_len]
    cos, sin = rope_tables(cfg, max(n + shifts[-1], max(OTHER_DISTANCES) + 1), torch.device("cpu"), torch.float32, local)

    def rotated(x, p):  # x (head_dim,) at position p, as the model rotates it
        return apply_rope(x.view(1, 1, -1), cos[p:p + 1, None], sin[p:p + 1, None]).view(-1)

    scores = [{"query_position": n - 1 + s, "key_position": s, "distance": n - 1,
               "score": float(rotated(q, n - 1 + s) @ rotated(k, s)) * cfg.attn_scale} for s in shifts]
    # The same two vectors at other distances: another score each (the distance is what counts).
    others = [{"query_position": dist, "key_position": 0, "distance": dist,
               "score": float(rotated(q, dist) @ rotated(k, 0)) * cfg.attn_scale}
              for dist in OTHER_DISTANCES if dist != n - 1 and dist < cfg.max_seq_len]
    return {"theta": cfg.local_rope_theta if local else cfg.rope_theta, "other_distances": others,
            "layer0_sliding": local, "full_theta": cfg.rope_theta, "head_dim": cfg.head_dim, "rotary_dim": cfg.rotary_dim,
            "scaling": cfg.rope_scaling.rope_type, "layer": 0, "pairs": angles, "positions": list(range(n)),
            "layers_without_rope": list(cfg.nope_layers),
            "scores": scores, "scale": cfg.attn_scale}


def _layer0_qk(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's unrotated query of the last position (head 0) and key of the first (KV head 0),
    float32 on the CPU: the projection as Attention.project makes it, before RoPE."""
    cfg = model.cfg
    layer = model.layers[0]
    x = layer._norm(layer.attention_norm, model.embed(torch.tensor([ids], device=model.device)))  # (1, T, hidden)
    attn = layer.attention
    qkv = attn.wqkv(x)  # (1, T, q_dim + 2 kv_dim)
    if attn.bqkv is not None:
        qkv = qkv + attn.bqkv
    if attn.full_norms:  # OLMo 2: the whole q and k normed before they are cut into heads
        qkv = attn._norm_full(qkv)
    qkv = qkv.view(1, len(ids), cfg.n_heads + 2 * cfg.n_kv_heads, cfg.head_dim)
    q, k = qkv[0, -1, 0], qkv[0, 0, cfg.n_heads]  # (head_dim,) each
    if attn.q_norm is not None and not attn.full_norms:
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q.float().cpu(), k.float().cpu()


def layers(cfg: ModelConfig, n: int, bytes_per_value: int, pattern: torch.Tensor) -> dict:
    """One layer's path with this model's shapes for the n prompt positions, the causal mask as
    the prompt's n×n matrix filled with layer 0 head 0's real attention weights (pattern:
    (heads, n, n) from Engine.attention_pattern), then × n_layers."""
    h, d = cfg.hidden_size, cfg.head_dim
    rows = {r.name: r for r in stages(cfg, n, n, bytes_per_value)}
    shown = min(n, MATRIX_MAX)
    window = cfg.sliding_window if cfg.is_sliding(0) else None
    weights = pattern[0, :shown, :shown]
    mask = [[int(j <= i and (window is None or i - j < window)) for j in range(shown)] for i in range(shown)]
    glu = "SwiGLU (silu)" if cfg.activation == "silu" else "GeGLU (gelu tanh)"
    steps = [
        ("input", f"[{n}, {h}]", "the residual stream: one vector per position"),
        ("RMSNorm (pre-norm)", f"[{n}, {h}]", "x / rms(x) × weight, before attention"),
        ("Q projection", f"[{n}, {h}] × [{h}, {cfg.q_dim}] → [{n}, {cfg.n_heads}, {d}]", f"{cfg.n_heads} query heads"),
        ("K, V projections", f"[{n}, {h}] × [{h}, {cfg.kv_dim}] → [{n}, {cfg.n_kv_heads}, {d}] each",
         f"{cfg.n_kv_heads} KV heads" + (f", each shared by {cfg.n_rep} query heads (grouped-query attention)"
                                         if cfg.n_rep > 1 else " (one per query head)")),
        ("RoPE", "Q, K rotated by position", "chapter 3"),
        ("scores = QKᵀ/√d + mask", f"[{cfg.n_heads}, {n}, {n}]", f"scaled by {cfg.attn_scale:.4g}"
         + (f", soft-capped to ±{cfg.attn_logit_softcap:g} ({cfg.attn_logit_softcap:g} · tanh(s / {cfg.attn_logit_softcap:g}))"
            if cfg.attn_logit_softcap else "") + "; the causal mask sets future positions to -∞"
         + (f" and, on sliding layers, positions more than {cfg.sliding_window:,} back" if cfg.layer_types else "")),
        ("softmax", f"[{cfg.n_heads}, {n}, {n}]", "each row sums to 1"),
        ("× V", f"[{cfg.n_heads}, {n}, {d}] → [{n}, {cfg.q_dim}]", "a weighted average of the values"),
        ("output projection", f"[{n}, {cfg.q_dim}] × [{cfg.q_dim}, {h}] → [{n}, {h}]", ""),
        ("residual add", f"[{n}, {h}]", "x + attention(x)" + (" (normed first: the family's norms after each branch)" if cfg.post_norms else "")
         + (f", × {cfg.residual_multiplier:g} first" if cfg.residual_multiplier != 1 else "")),
        ("RMSNorm (pre-norm)", f"[{n}, {h}]", "before the MLP"),
        ("gate, up projections", f"[{n}, {h}] × [{h}, {cfg.intermediate_size}] → [{n}, {cfg.intermediate_size}] each", glu + " of gate × up"),
        ("down projection", f"[{n}, {cfg.intermediate_size}] × [{cfg.intermediate_size}, {h}] → [{n}, {h}]", ""),
        ("residual add", f"[{n}, {h}]", "x + mlp(x)"),
    ]
    per_layer = [rows[k] for k in rows if k.endswith("(per layer)")]
    # The counter counts every one of the n × n scores (masked ones too, as the kernel computes
    # them); the causal mask (and a sliding window) keeps these of them.
    kept = sum(j <= i and (window is None or i - j < window) for i in range(n) for j in range(n))
    scores = next(r for r in per_layer if r.name.startswith("attention softmax"))
    return {"n_positions": n, "hidden": h, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "head_dim": d,
            "group_size": cfg.n_rep, "intermediate": cfg.intermediate_size,
            "expansion": cfg.intermediate_size / h, "mlp_matrices": 3, "activation": glu,
            "norm": ("RMSNorm, pre-norm" if cfg.pre_norms else "RMSNorm after each branch only") + (" plus sandwich norms" if cfg.post_norms and cfg.pre_norms else ""),
            "n_layers": cfg.n_layers, "steps": [{"step": s, "shape": sh, "note": note} for s, sh, note in steps],
            "mask": mask, "attention_layer0_head0": [[round(v, 4) for v in r] for r in weights.tolist()],
            "matrix_positions": shown, "sliding_window": window,
            "per_layer": [{"stage": r.name.removesuffix(" (per layer)").replace(", causal", f", all {n}×{n} scores"),
                           "flops": r.flops, "bytes": r.bytes} for r in per_layer],
            "layer_flops": sum(r.flops for r in per_layer), "all_layers_flops": rows[f"all {cfg.n_layers} layers"].flops,
            "family_path": family_path(cfg),
            "scores_counted": n * n, "scores_kept": kept, "scores_kept_flops": scores.flops * kept // (n * n)}


def lm_head(model, tokenizer, logits: torch.Tensor, top: int) -> dict:
    """The last position's logits over the vocabulary: the top ones, and the head's weights as
    the model keeps them (a GGUF file's blocks or its dtype)."""
    cfg: ModelConfig = model.cfg
    probs = logits.double().softmax(-1)
    values, order = logits.topk(top)
    head = model.output
    if head.qweight is not None:
        dtype, nbytes = blocks_name(head.qweight.types()), head.qweight.nbytes
    else:
        dtype, nbytes = _dtype_name(head.weight.dtype), head.weight.numel() * head.weight.element_size()
    return {"hidden": cfg.hidden_size, "vocab_size": cfg.vocab_size, "shape": [cfg.hidden_size, cfg.vocab_size],
            "tied": cfg.tie_word_embeddings, "dtype": dtype, "bytes": nbytes,
            "extra_bytes": 0 if cfg.tie_word_embeddings else nbytes,
            "softcap": cfg.final_logit_softcap,
            "top": [{"id": i, "piece": tokenizer.piece(i), "logit": float(v), "prob": float(probs[i])}
                    for v, i in zip(values.tolist(), order.tolist())]}
