"""Rotary position embedding: frequencies (with linear / llama3 scaling) and their application."""

from __future__ import annotations

import math

import torch

from inference.model.config import ModelConfig, RopeScaling


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies, (head_dim // 2,), float32, with the config's scaling applied; local:
    those of sliding layers with a base of their own (Gemma 3's local_rope_theta, unscaled)."""
    dim = cfg.head_dim
    theta = cfg.local_rope_theta if local else cfg.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = RopeScaling() if local else cfg.rope_scaling
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
    return inv_freq.float()


def rope_tables(cfg: ModelConfig, max_len: int, device: torch.device, dtype: torch.dtype,
                local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin tables, each (max_len, head_dim), in the rotate-half layout: halves
    repeated, and the sin's first half negated (see apply_rope).

    Computed in float32 and then cast, as the reference implementation does.
    """
    inv_freq = rope_inv_freq(cfg, local).to(device)
    pos = torch.arange(max_len, dtype=torch.float32, device=device)
    freqs = torch.outer(pos, inv_freq)  # (max_len, head_dim // 2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (max_len, head_dim)
    sign = torch.ones(cfg.head_dim, device=device)
    sign[:cfg.head_dim // 2] = -1
    return emb.cos().to(dtype), (emb.sin() * sign).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., T, heads, head_dim) by positions whose tables are (T, 1, head_dim).

    Hugging Face's "rotate half" layout: dimension i pairs with i + head_dim/2, and
    x * cos + cat(-x2, x1) * sin == x * cos + roll(x, half) * signed_sin, in three ops.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)
