"""Replaying a step's sampling under other settings, from a compact copy of its logits.

Each step keeps its KEEP largest logits exactly and the rest as one log-sum-exp: 256 x
(4-byte id + 4-byte logit) + 16 bytes = about 2 KiB a step, 2 MiB for a 1,000-token run
(a full float16 vector would be 96 KiB a step for SmolLM2's 49,152 tokens). To replay, the
vector is rebuilt with the remaining tokens sharing their mass equally, and the very same
sampling functions as generation run on it: exact whenever the tokens that matter lie in the
top KEEP, which they do unless top-k > KEEP or a high temperature with no filter lifts the tail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .sampling import SamplingParams, stages

KEEP = 256  # also what keeps the per-step cost small: top-256 costs 0.2 ms, top-1024 0.7 ms


@dataclass
class StepLogits:
    ids: torch.Tensor  # (K,) int32, most likely first
    logits: torch.Tensor  # (K,) float32
    rest_lse: float  # log-sum-exp of the other vocab_size - K logits (-inf if none)
    vocab_size: int

    @property
    def nbytes(self) -> int:
        return self.ids.numel() * 4 + self.logits.numel() * 4 + 16

    def full(self) -> torch.Tensor:
        """A (vocab,) logit vector: the kept logits exact, the rest equal and with their mass."""
        n_rest = self.vocab_size - self.ids.numel()
        fill = self.rest_lse - math.log(n_rest) if n_rest > 0 else -math.inf
        out = torch.full((self.vocab_size,), fill, dtype=torch.float32)
        out[self.ids.long()] = self.logits
        return out


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


def replay(step: StepLogits, params: SamplingParams, seen_ids: list[int], chosen: int
           ) -> tuple[list[StageStat], torch.Tensor]:
    """The pipeline of a stored step under `params`, with no model call."""
    logits = step.full()
    seen = torch.zeros(step.vocab_size, dtype=torch.bool)
    if seen_ids:
        seen[torch.tensor(seen_ids)] = True
    return pipeline(logits, params, seen, chosen)
