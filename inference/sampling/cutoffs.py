"""Stages that keep a set of tokens and remove the rest (-inf): top-k, top-p, min-p, typical-p,
the epsilon and eta cutoffs and top-nσ. None reorders the tokens it keeps; each keeps at least one."""

from __future__ import annotations

import math

import torch

from inference.sampling.registry import stage

TOP_P_FIRST = 1024  # candidates searched for top-p's set before sorting the whole vocabulary


def apply_top_k(logits: torch.Tensor, k: int, seen=None) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th value are kept too); 0 = off."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def apply_top_p(logits: torch.Tensor, p: float, seen=None) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p (at least one)."""
    if p >= 1.0:
        return logits
    probs = logits.softmax(dim=-1)
    # The kept set is a prefix of the tokens in descending order: look for its end among the
    # most likely TOP_P_FIRST first (a sort of a 49,152-token vocabulary costs ~4 ms on a CPU).
    k = min(TOP_P_FIRST, logits.shape[-1])
    sorted_probs, order = probs.topk(k, dim=-1)  # (..., k), descending
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of all more likely tokens
    if k < logits.shape[-1] and not bool((mass_before[..., -1] >= p).all()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # the set is larger: all of them
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_before < p  # the first token has mass_before 0 < p: always kept
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, keep_sorted)
    return logits.masked_fill(~keep, -math.inf)


def apply_min_p(logits: torch.Tensor, min_p: float, seen=None) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the top token's."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, -math.inf)


def _keep_top(logits: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """Remove the marked tokens, but never the most likely one (nor those tied with it)."""
    return logits.masked_fill(remove & (logits < logits.amax(dim=-1, keepdim=True)), -math.inf)


def apply_typical_p(logits: torch.Tensor, mass: float) -> torch.Tensor:
    """Locally typical sampling (Meister et al.): order tokens by |surprise - entropy|, keep the
    closest ones until their probability reaches `mass` (the token that reaches it included)."""
    if mass >= 1.0:
        return logits
    logp = logits.log_softmax(dim=-1)
    p = logp.exp()
    entropy = -(p * logp).nansum(dim=-1, keepdim=True)
    distance = (-logp - entropy).abs()  # (..., vocab); removed tokens: inf
    order = distance.argsort(dim=-1, stable=True)  # (..., vocab), most typical first
    mass_before = p.gather(-1, order).cumsum(dim=-1) - p.gather(-1, order)
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, mass_before < mass)
    # Tokens as typical as the last one kept stay too (transformers compares the distance).
    last = distance.masked_fill(~keep, -math.inf).amax(dim=-1, keepdim=True)
    return logits.masked_fill(distance > last, -math.inf)  # the most typical token is always kept


def apply_epsilon(logits: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Epsilon sampling (Hewitt et al.): remove tokens of probability below epsilon."""
    if epsilon <= 0:
        return logits
    return _keep_top(logits, logits.softmax(dim=-1) < epsilon)


def apply_eta(logits: torch.Tensor, eta: float) -> torch.Tensor:
    """Eta sampling (Hewitt et al.): remove tokens below min(eta, sqrt(eta) * exp(-entropy))."""
    if eta <= 0:
        return logits
    logp = logits.log_softmax(dim=-1)
    p = logp.exp()
    entropy = -(p * logp).nansum(dim=-1, keepdim=True)
    cut = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * (-entropy).exp())
    return _keep_top(logits, p < cut)


def apply_top_n_sigma(logits: torch.Tensor, n: float) -> torch.Tensor:
    """Top-nσ (Tang et al. 2024), as llama.cpp computes it: keep logits >= max - n * σ, σ the
    population standard deviation of the finite logits; 0 = off."""
    if n <= 0:
        return logits
    finite = torch.isfinite(logits)
    count = finite.sum(dim=-1, keepdim=True)
    values = logits.masked_fill(~finite, 0.0)
    mean = values.sum(dim=-1, keepdim=True) / count
    std = (((values - mean) ** 2) * finite).sum(dim=-1, keepdim=True).div(count).sqrt()
    top = logits.amax(dim=-1, keepdim=True)
    return logits.masked_fill(logits < top - n * std, -math.inf)


stage("top_k")(lambda logits, p, state: apply_top_k(logits, p.top_k))
stage("top_p")(lambda logits, p, state: apply_top_p(logits, p.top_p))
stage("min_p")(lambda logits, p, state: apply_min_p(logits, p.min_p))
stage("typical_p")(lambda logits, p, state: apply_typical_p(logits, p.typical_p))
stage("epsilon_cutoff")(lambda logits, p, state: apply_epsilon(logits, p.epsilon_cutoff))
stage("eta_cutoff")(lambda logits, p, state: apply_eta(logits, p.eta_cutoff))
stage("top_n_sigma")(lambda logits, p, state: apply_top_n_sigma(logits, p.top_n_sigma))
