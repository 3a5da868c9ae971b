"""FLOPs and bytes per token, from the config alone (a multiply-add counts as 2 FLOPs)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig


@dataclass(frozen=True)
class TokenCost:
    attention_proj: int  # Q, K, V and output projections, all layers
    attention_scores: int  # QK^T and attention x V over the context, all layers
    ffn: int  # SwiGLU gate, up and down, all layers
    lm_head: int
    weight_bytes: int  # weights read once per decode step
    kv_bytes: int  # KV cache read per decode step at this context length

    @property
    def total(self) -> int:
        return self.attention_proj + self.attention_scores + self.ffn + self.lm_head


def token_cost(cfg: ModelConfig, context_len: int, bytes_per_weight: int) -> TokenCost:
    """Cost of one new token that attends to `context_len` positions (itself included)."""
    h, L = cfg.hidden_size, cfg.n_layers
    proj = 2 * L * (h * cfg.q_dim + 2 * h * cfg.kv_dim + cfg.q_dim * h)
    scores = 2 * L * 2 * context_len * cfg.q_dim  # QK^T and AV: 2 FLOPs x ctx x head_dim per head
    ffn = 2 * L * 3 * h * cfg.intermediate_size
    head = 2 * h * cfg.vocab_size
    params = cfg.param_counts()
    # The embedding row lookup reads one row; a tied head reads the whole matrix anyway.
    weight_elems = params["attention"] + params["ffn"] + params["norms"] + cfg.vocab_size * h
    return TokenCost(proj, scores, ffn, head, weight_elems * bytes_per_weight,
                     context_len * cfg.kv_bytes_per_token(bytes_per_weight))
