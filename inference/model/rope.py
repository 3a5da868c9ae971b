"""Rotary position embedding: frequencies (with linear, llama3, YaRN, LongRoPE scaling or a GGUF
file's factors) and their application, to every dim of a head or its first ones (partial rotary)."""

from __future__ import annotations

import math

import torch

from inference.model.config import ModelConfig, RopeScaling


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies, (rotary_dim // 2,), float32, with the config's scaling applied; local:
    those of sliding layers with a base of their own (Gemma 3's local_rope_theta, unscaled)."""
    dim = cfg.rotary_dim
    theta = cfg.local_rope_theta if local else cfg.rope_theta
    rs = RopeScaling() if local else cfg.rope_scaling
    if rs.rope_type == "longrope":  # transformers' float32 arithmetic, short factors (families._longrope)
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (torch.tensor(rs.short_factor, dtype=torch.float32) * theta ** shape)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rs.rope_type == "linear":
        inv_freq = inv_freq / rs.factor
    elif rs.rope_type == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
        high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
        smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
            rs.high_freq_factor - rs.low_freq_factor)
        blended = (1 - smooth) * scaled / rs.factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(is_medium, blended, scaled)
    elif rs.rope_type == "factors":  # llama.cpp's rope_freqs.weight: each frequency divided by its factor
        if len(rs.factors) != dim // 2:
            raise ValueError(f"{len(rs.factors)} RoPE factors for {dim // 2} frequencies")
        inv_freq = inv_freq.float().double() / torch.tensor(rs.factors, dtype=torch.float32).double()
    elif rs.rope_type == "yarn":
        return _yarn_inv_freq(theta, dim, rs)
    return inv_freq.float()


def _yarn_inv_freq(theta: float, dim: int, rs: RopeScaling) -> torch.Tensor:
    """YaRN (Peng et al. 2023) as transformers computes it: low frequencies interpolated by
    `factor`, high ones kept, a linear ramp between the dims their beta bounds say."""
    def correction_dim(rotations: float) -> float:
        return dim * math.log(rs.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = max(math.floor(correction_dim(rs.beta_fast)), 0), min(math.ceil(correction_dim(rs.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1 - ramp
    return (1.0 / (rs.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_attention_factor(cfg: ModelConfig, local: bool = False) -> float:
    """What the cos and sin tables are multiplied by: YaRN's or LongRoPE's attention factor, else 1."""
    rs = cfg.rope_scaling
    if local or rs.rope_type not in ("yarn", "longrope"):
        return 1.0
    if rs.attention_factor is not None:
        return rs.attention_factor
    if rs.factor <= 1:
        return 1.0
    if rs.rope_type == "longrope":
        return math.sqrt(1 + math.log(rs.factor) / math.log(rs.original_max_position_embeddings))
    return 0.1 * math.log(rs.factor) + 1.0


def rope_tables(cfg: ModelConfig, max_len: int, device: torch.device, dtype: torch.dtype,
                local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin tables, each (max_len, rotary_dim), in the rotate-half layout: halves
    repeated, and the sin's first half negated (see apply_rope).

    Computed in float32 and then cast, as the reference implementation does.
    """
    inv_freq = rope_inv_freq(cfg, local).to(device)
    pos = torch.arange(max_len, dtype=torch.float32, device=device)
    freqs = torch.outer(pos, inv_freq)  # (max_len, head_dim // 2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (max_len, rotary_dim)
    sign = torch.ones(cfg.rotary_dim, device=device)
    sign[:cfg.rotary_dim // 2] = -1
    scale = rope_attention_factor(cfg, local)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), (sin * sign).to(dtype)


def identity_tables(cfg: ModelConfig, max_len: int, device: torch.device,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables that rotate nothing (cos 1, sin 0: x * 1 + y * 0 is x exactly), for layers
    without RoPE (SmolLM3's), so they run every path's rotation code unchanged."""
    return (torch.ones(max_len, cfg.rotary_dim, device=device, dtype=dtype),
            torch.zeros(max_len, cfg.rotary_dim, device=device, dtype=dtype))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., T, heads, head_dim) by positions whose tables are (T, 1, r): its first r
    dims (r < head_dim: partial rotary, the rest passed through as they are).

    Hugging Face's "rotate half" layout: dimension i pairs with i + r/2, and
    x * cos + cat(-x2, x1) * sin == x * cos + roll(x, r/2) * signed_sin, in three ops.
    """
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return torch.addcmul(x * cos, x.roll(r // 2, dims=-1), signed_sin)
    turned = x[..., :r]  # (..., r): transformers' q_rot / k_rot
    return torch.cat((torch.addcmul(turned * cos, turned.roll(r // 2, dims=-1), signed_sin), x[..., r:]), dim=-1)
