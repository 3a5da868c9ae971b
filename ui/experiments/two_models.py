"""Compare A/B across two models: where their tokenizers agree, both read the same token ids
(each its own prompt, then A's generated tokens) and their next-token distributions are
compared step by step: KL(A‖B) of the raw distributions, and the first step where their greedy
choices part."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def same_vocabulary(tok_a, tok_b) -> bool:
    """Whether an id means the same bytes in both tokenizers (then their distributions are over
    the same outcomes)."""
    a, b = getattr(tok_a, "token_bytes", None), getattr(tok_b, "token_bytes", None)
    return a is not None and a == b


@dataclass
class TwoModels:
    """Per step of A's text: KL(A‖B) in nats, each model's top token and its probability, and
    the probability each gave the token A chose; `split`: the first step whose greedy choices
    differ (None: they agree at every step)."""
    kl: list[float]
    top_a: list[tuple[int, float]]
    top_b: list[tuple[int, float]]
    chosen: list[tuple[int, float, float]]  # (A's token, its p under A, under B)
    split: int | None


def along(logits_a: torch.Tensor, logits_b: torch.Tensor, chosen: list[int]) -> TwoModels:
    """logits_a, logits_b: (steps, vocab) raw logits of each model before each of A's tokens
    `chosen` (same vocabulary). Float64, so that a KL of two near-equal distributions is not
    rounding noise."""
    la = logits_a.double().log_softmax(-1)  # (steps, vocab)
    lb = logits_b.double().log_softmax(-1)
    kl = (la.exp() * (la - lb)).sum(-1).clamp_min(0.0)  # (steps,)
    pa, ia = la.max(-1)
    pb, ib = lb.max(-1)
    ids = torch.tensor(chosen)[:, None]  # (steps, 1)
    ca, cb = la.gather(-1, ids)[:, 0].exp(), lb.gather(-1, ids)[:, 0].exp()
    parts = (ia != ib).nonzero()
    return TwoModels(kl.tolist(), list(zip(ia.tolist(), pa.exp().tolist())),
                     list(zip(ib.tolist(), pb.exp().tolist())),
                     list(zip(chosen, ca.tolist(), cb.tolist())),
                     int(parts[0, 0]) if len(parts) else None)
