"""Sampling: pure functions from logits to the distribution sampled from, and the draw.

Order, as in transformers: repetition penalty -> temperature -> top-k -> top-p -> min-p.
Filters set removed logits to -inf; the final distribution is softmax of what is left.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from inference.sampling.params import SamplingParams
from inference.sampling.settings import BY_NAME, FILTER_SETTINGS

TOP_P_FIRST = 1024  # candidates searched for top-p's set before sorting the whole vocabulary

# setting name -> (label, stage function (logits, value, seen) -> logits), in the order applied.
STAGES: dict[str, tuple[str, Callable]] = {}


def stage(name: str):
    """Register the stage function of the setting `name` (labelled as the schema labels it);
    stages run in the order registered."""
    def register(fn):
        STAGES[name] = (BY_NAME[name].label.lower(), fn)
        return fn
    return register


# ---------------------------------------------------------------- the stages

@stage("repetition_penalty")
def apply_repetition_penalty(logits: torch.Tensor, penalty: float, seen: torch.Tensor | None) -> torch.Tensor:
    """Divide positive logits and multiply negative ones of every seen token by `penalty`.

    `seen` is a bool mask over the vocabulary: the prompt's and generated tokens (None: none known).
    """
    if penalty == 1.0 or seen is None:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


@stage("temperature")
def apply_temperature(logits: torch.Tensor, temperature: float, seen=None) -> torch.Tensor:
    """Divide by the temperature; 0 keeps only the argmax (greedy)."""
    if temperature == 0:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep.scatter_(-1, logits.argmax(dim=-1, keepdim=True), True)
        return logits.masked_fill(~keep, -math.inf)
    return logits if temperature == 1.0 else logits / temperature


@stage("top_k")
def apply_top_k(logits: torch.Tensor, k: int, seen=None) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th value are kept too); 0 = off."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -math.inf)


@stage("top_p")
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


@stage("min_p")
def apply_min_p(logits: torch.Tensor, min_p: float, seen=None) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the top token's."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, -math.inf)


assert set(STAGES) == set(FILTER_SETTINGS), "every sampling setting of the schema has its stage"


def stages(params: SamplingParams, seen: torch.Tensor | None):
    """(label, function of logits) for each stage, in order, with these settings."""
    return [(label, lambda x, fn=fn, v=getattr(params, name): fn(x, v, seen))
            for name, (label, fn) in STAGES.items()]


def final_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None) -> torch.Tensor:
    """All stages in order; softmax of the result is the distribution sampled from."""
    for _, fn in stages(params, seen):
        logits = fn(logits)
    return logits


def final_probs(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None) -> torch.Tensor:
    """softmax(final_logits): the distribution sampled from. Greedy keeps one token, whose
    probability every later stage leaves at 1: its one-hot is made directly, without the passes
    over the vocabulary that masking and a softmax would cost."""
    if params.temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, greedy_logits(logits, params, seen).argmax(dim=-1, keepdim=True), 1.0)
    return final_logits(logits, params, seen).softmax(dim=-1)


def greedy_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None) -> torch.Tensor:
    """What greedy decoding takes the argmax of (the first of equal maxima): the logits after
    the repetition penalty, the one stage that can move it (temperature 0 keeps one token,
    which no later filter removes)."""
    return apply_repetition_penalty(logits, params.repetition_penalty, seen)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token id per row of probs (bsz, vocab) -> (bsz, 1).

    Inverse transform: one uniform number u per row, and the first token whose cumulative
    probability exceeds u * total. Exact for the distribution given; one random number a row
    where torch.multinomial draws one per token (1.4 ms for 49,152 tokens on a CPU). Sums in
    float64, so a tail of 1e-9 keeps its share; a token of probability 0 is never drawn.
    """
    cdf = probs.double().cumsum(dim=-1)  # (bsz, vocab)
    total = cdf[:, -1:]  # (bsz, 1)
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=probs.device)
    # Strictly below the total even if u * total rounds up to it: the last cdf entry then exceeds it.
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)  # (bsz, 1)
