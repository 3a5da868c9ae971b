"""What a constraint costs the model at one step: the distribution the run samples from (its
stages with the constraint) against the free one (the same stages, the same state, without it).

Computed where the step is sampled (step_stats.pick_rows), from the very logits the run drew
from: the free distribution needs the run's state at that step (its penalties' counts, DRY's
ids, XTC's coin, Mirostat's μ), which the run holds then. Recomputed later it would need the state
rebuilt and a second forward pass, whose logits differ from the run's in the last digits
(design.md: within 1e-4). Nothing here is approximated:

- kl: KL(constrained ‖ free) = Σ c (log c − log f) over the tokens the constrained distribution
  can draw, in float64 from the two final logit vectors' log-softmax. It is finite wherever the
  free distribution keeps every token the constrained one can draw (the constraint after every
  cutoff: then it is −log of the free mass the constraint allows), and +inf where the
  constrained one can draw a token the free one's stages removed (a cutoff after the constraint
  keeping a token it would not have kept; greedy choosing another token).
- free_prob: the chosen token's probability in the free final distribution (float32 softmax, as
  the run's own `prob`): a run's log-probability without the constraint's renormalisation is the
  sum of their logs, with it the sum of the logs of `prob`.
- removed: the free distribution's most likely tokens (its top_n) that the constraint forbade,
  with their free probability and their raw logit (the step's raw probability is made from it
  as every candidate's is).

Greedy's final distributions are one-hot (the argmax after the stages before temperature): the
free one is the argmax without the constraint, so kl is 0 where the two tokens agree and +inf
where they differ, and free_prob 1 or 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference.sampling.params import SamplingParams
from inference.sampling.stages import stages
from inference.sampling.state import RunState


@dataclass(frozen=True)
class ConstraintCost:
    kl: float  # KL(constrained ‖ free) in nats; math.inf where the free distribution cannot draw a token the constrained one can
    free_prob: float  # the chosen token's probability in the free final distribution
    removed: tuple[tuple[int, float, float], ...]  # (id, free p, raw logit): the free top tokens the constraint forbade


def free_logits(logits: torch.Tensor, params: SamplingParams, state: RunState | None,
                until: str | None = None) -> torch.Tensor:
    """The run's stages in its order without the constraint's (before the stage `until`, where
    given): the logits the run would have sampled from unconstrained. (vocab,) -> (vocab,)"""
    for name, _, fn in stages(params, state):
        if name == until:
            break
        if name != "constraint":
            logits = fn(logits)
    return logits


def drawn_cost(raw: torch.Tensor, constrained: torch.Tensor, params: SamplingParams, state: RunState,
               chosen: int, top_n: int) -> ConstraintCost:
    """A drawn row's cost: raw (vocab,) its logits, constrained (vocab,) its final logits (every
    stage, the constraint included; -inf where removed), chosen the token drawn."""
    free = free_logits(raw, params, state)  # (vocab,)
    lc, lf = constrained.double().log_softmax(-1), free.double().log_softmax(-1)  # (vocab,) each
    on = torch.isfinite(lc)  # the tokens the constrained distribution can draw
    if bool((on & ~torch.isfinite(lf)).any()):
        kl = math.inf
    else:
        kl = float((lc[on].exp() * (lc[on] - lf[on])).sum())
    free_p = free.softmax(-1)  # (vocab,) float32, as the run's own probabilities
    return ConstraintCost(kl, float(free_p[chosen]), _removed(free_p, raw, state, top_n))


def greedy_cost(raw: torch.Tensor, params: SamplingParams, state: RunState, chosen: int) -> ConstraintCost:
    """A greedy row's cost: its one-hot against the one-hot of the free argmax (the stages before
    temperature without the constraint; the first of equal maxima, as greedy's)."""
    free = int(free_logits(raw, params, state, until="temperature").argmax())
    removed = ((free, 1.0, float(raw[free])),) if not bool(state.constraint.allowed[free]) else ()
    return ConstraintCost(0.0 if free == chosen else math.inf, 1.0 if free == chosen else 0.0, removed)


def _removed(free_p: torch.Tensor, raw: torch.Tensor, state: RunState, top_n: int) -> tuple:
    """The free distribution's top_n tokens (with a probability above 0) the constraint forbids,
    most likely first (equal ones by id, as the bars)."""
    k = min(max(top_n, 1), free_p.numel())
    p, ids = free_p.topk(k)  # (k,) each
    allowed = state.constraint.allowed.to(free_p.device)
    return tuple((int(i), float(q), float(raw[i])) for q, i in sorted(zip(p.tolist(), ids.tolist()), key=lambda t: (-t[0], t[1]))
                 if q > 0 and not bool(allowed[i]))
