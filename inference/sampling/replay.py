"""Replaying a step's sampling under other settings: the stage-by-stage pipeline on the step's
full logit vector.

The vector is recomputed with one forward pass over the step's context (the prompt and the
tokens before it): the same float32 arithmetic a run does at that step, so the replayed
distribution is the one a real run with those settings would sample from, for every token of
the vocabulary. Nothing is stored per step; a replay costs one prefill of the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.sampling.params import SamplingParams
from inference.sampling.stages import stages


@dataclass
class StageStat:
    name: str
    kept: int  # candidates left
    mass_removed: float  # probability mass this stage removed (of the distribution entering it)
    chosen_rank: int | None  # 1 = most likely; None when this stage removed the chosen token
    chosen_prob: float  # in this stage's renormalized distribution


def _stat(name: str, logits: torch.Tensor, removed_mass: float, chosen: int) -> StageStat:
    probs = logits.softmax(-1)
    kept = int(torch.isfinite(logits).sum())
    alive = bool(torch.isfinite(logits[chosen]))
    rank = int((logits > logits[chosen]).sum()) + 1 if alive else None
    return StageStat(name, kept, removed_mass, rank, float(probs[chosen]) if alive else 0.0)


def pipeline(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None,
             chosen: int) -> tuple[list[StageStat], torch.Tensor]:
    """Every stage of sampling on a (vocab,) logit vector: what it left and where `chosen` stood.

    Returns the stages and the final distribution. The stages are those of sampling.final_logits.
    """
    stats = [_stat("raw", logits, 0.0, chosen)]
    for name, fn in stages(params, seen):
        before = logits.softmax(-1)
        logits = fn(logits)
        removed = float(before[~torch.isfinite(logits)].sum())
        stats.append(_stat(name, logits, removed, chosen))
    final = logits.softmax(-1)
    stats.append(_stat("final (renormalized)", logits, 0.0, chosen))
    return stats, final


def seen_mask(vocab_size: int, seen_ids: list[int], device=None) -> torch.Tensor:
    """The repetition penalty's bool mask over the vocabulary."""
    seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    if seen_ids:
        seen[torch.tensor(seen_ids, device=device)] = True
    return seen
