"""Stages whose effect depends on the step: temperature (dynamic with a range, from the
entropy), XTC (a coin per step) and Mirostat v2 (the run's μ)."""

from __future__ import annotations

import math

import torch

from inference.sampling.registry import stage


# Below this temperature the logits are first shifted by their largest (softmax is the same), so
# that dividing cannot overflow float32: at 1e-37 a logit of 40 would be infinite, and the
# distribution not a number. At or above it a logit would need to exceed 3e35 to overflow.
SHIFTED_BELOW = 2.0 ** -10


def apply_temperature(logits: torch.Tensor, temperature: float, seen=None) -> torch.Tensor:
    """Divide by the temperature; 0 keeps only the argmax (greedy)."""
    if temperature == 0:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep.scatter_(-1, logits.argmax(dim=-1, keepdim=True), True)
        return logits.masked_fill(~keep, -math.inf)
    if temperature < SHIFTED_BELOW:  # every value <= 0 after the shift: none overflows
        return (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    return logits if temperature == 1.0 else logits / temperature


def dynamic_temperature(logits: torch.Tensor, temperature: float, spread: float, exponent: float) -> torch.Tensor:
    """llama.cpp's dynamic temperature for a (vocab,) row: T in [max(0, t - spread), t + spread],
    min + (max - min) * (H / log n)^exponent, H the entropy of the finite candidates and n their
    number. One candidate: nothing to scale."""
    n = int(torch.isfinite(logits).sum())
    if n <= 1:
        return logits
    lo, hi = max(0.0, temperature - spread), temperature + spread
    logp = logits.log_softmax(dim=-1)
    entropy = float(-(logp.exp() * logp).nansum())
    t = lo + (hi - lo) * (entropy / math.log(n)) ** exponent
    return apply_temperature(logits, t) if t > 0 else apply_temperature(logits, 0.0)


def apply_xtc(logits: torch.Tensor, threshold: float, probability: float, coin: float | None) -> torch.Tensor:
    """XTC ("exclude top choices"), as llama.cpp and text-generation-webui: when coin <
    probability, remove every token of probability >= threshold except the least likely of
    them; with fewer than two such tokens nothing changes."""
    if coin is None or coin >= probability:
        return logits
    probs = logits.softmax(dim=-1)
    top = probs >= threshold
    if int(top.sum()) < 2:
        return logits
    least = probs.masked_fill(~top, math.inf).argmin(dim=-1, keepdim=True)  # the least likely top token
    return logits.masked_fill(top.scatter(-1, least, False), -math.inf)


def apply_mirostat(logits: torch.Tensor, mu: float | None) -> torch.Tensor:
    """Mirostat v2's truncation, as llama.cpp: keep the tokens whose surprise -log2 p is at most
    μ (at least the most likely one). μ is the run's state; RunState.advance moves it."""
    if mu is None:
        return logits
    surprise = -logits.log_softmax(dim=-1) / math.log(2)
    remove = (surprise > mu) & (logits < logits.amax(dim=-1, keepdim=True))
    return logits.masked_fill(remove, -math.inf)


@stage("temperature")
def _temperature(logits, p, state):
    if p.dynatemp_range > 0 and not p.greedy:
        return dynamic_temperature(logits, p.temperature, p.dynatemp_range, p.dynatemp_exponent)
    return apply_temperature(logits, p.temperature)


@stage("xtc_probability")
def _xtc(logits, p, state):
    return apply_xtc(logits, p.xtc_threshold, p.xtc_probability, None if state is None else state.coin)


@stage("mirostat_tau")
def _mirostat(logits, p, state):
    return apply_mirostat(logits, None if state is None or p.mirostat_tau == 0 else state.mu)
