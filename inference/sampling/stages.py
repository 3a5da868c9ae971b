"""Sampling: pure stage functions from logits to the distribution sampled from, and the draw.

The stages live by kind in penalties.py, cutoffs.py and dynamic.py, each registered under its
setting's name; they run in settings.DEFAULT_ORDER, or first those a run's sampler_order lists.
Filters set removed logits to -inf; the final distribution is softmax of what is left. Each stage
reads the logits, the run's settings and its RunState (state.py), and changes none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference.sampling import constrain, cutoffs, dynamic, penalties  # noqa: F401 - they register the stages
from inference.sampling.cutoffs import (TOP_P_FIRST, apply_epsilon, apply_eta, apply_min_p,  # noqa: F401
                                        apply_top_k, apply_top_n_sigma, apply_top_p, apply_typical_p)
from inference.sampling.dynamic import apply_temperature, apply_xtc, dynamic_temperature  # noqa: F401
from inference.sampling.params import SamplingParams
from inference.sampling.penalties import apply_repetition_penalty  # noqa: F401
from inference.sampling.registry import STAGES
from inference.sampling.settings import FILTER_SETTINGS, order
from inference.sampling.state import RunState

assert set(STAGES) == set(FILTER_SETTINGS), "every sampling setting of the schema has its stage"


def stages(params: SamplingParams, state: RunState | None):
    """(name, label, function of logits) for each stage, in the order this run runs them."""
    return [(name, STAGES[name][0], lambda x, fn=STAGES[name][1]: fn(x, params, state))
            for name in order(params.sampler_order)]


def final_logits(logits: torch.Tensor, params: SamplingParams, state: RunState | None) -> torch.Tensor:
    """All stages in order; softmax of the result is the distribution sampled from."""
    for _, _, fn in stages(params, state):
        logits = fn(logits)
    return logits


def final_logits_removing(logits: torch.Tensor, params: SamplingParams, state: RunState | None,
                          ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """final_logits, and for each of `ids` (k,) the position in the run's stage order of the stage
    that removed it (set its logit to -inf), -1 for one still in: what a candidate's bars say
    removed it. One look at k logits after each stage that changed anything."""
    removed = torch.full(ids.shape, -1, dtype=torch.long, device=logits.device)  # (k,)
    for k, (_, _, fn) in enumerate(stages(params, state)):
        out = fn(logits)
        if out is not logits:
            removed.masked_fill_((removed < 0) & ~torch.isfinite(out[ids]), k)
        logits = out
    return logits, removed


# The stages that read which token each logit is (a bias, the penalties, DRY, the constraint); the
# others read only the values, and keep or remove a logit by its value and the others'. Once a
# cutoff has left at most COMPACT logits finite, the rest of a run's stages run on those alone
# (their ids kept beside them, in vocabulary order): the same tokens kept, a few dozen numbers
# read instead of the vocabulary, and a step's cost no longer grows with the vocabulary per row.
READS_IDS = frozenset({"logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty",
                       "dry_multiplier", "constraint"})
CUTS = frozenset({"top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_n_sigma",
                  "xtc_probability", "mirostat_tau", "constraint"})
COMPACT = 2048


@dataclass
class Candidates:
    """A run's final logits: `values` over the whole vocabulary (ids None), or over `ids` alone
    (every other logit -inf); `removed`: for each tracked id, the position in the run's stage
    order of the stage that removed it (-1: still in); `unchanged`: no stage moved anything."""
    values: torch.Tensor
    ids: torch.Tensor | None
    removed: torch.Tensor
    unchanged: bool

    def at(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions in values, present) of token_ids: present False where the id was cut."""
        if self.ids is None:
            return token_ids, torch.ones_like(token_ids, dtype=torch.bool)
        pos = torch.searchsorted(self.ids, token_ids).clamp(max=self.ids.numel() - 1)
        return pos, self.ids[pos] == token_ids


def final_candidates(logits: torch.Tensor, params: SamplingParams, state: RunState | None,
                     track: torch.Tensor) -> Candidates:
    """final_logits_removing for a run's step, compacting once a cutoff leaves at most COMPACT
    logits finite; a stage that reads the ids after that runs on the whole vocabulary again."""
    removed = torch.full(track.shape, -1, dtype=torch.long, device=logits.device)  # (k,)
    c = Candidates(logits, None, removed, True)
    for k, (name, _, fn) in enumerate(stages(params, state)):
        if c.ids is not None and name in READS_IDS:  # the whole vocabulary again, for this stage
            c.values = torch.full_like(logits, -math.inf).index_copy_(0, c.ids, c.values)
            c.ids = None
        out = fn(c.values)
        if out is c.values:
            continue
        c.unchanged = False
        pos, present = c.at(track)
        removed.masked_fill_((removed < 0) & ~(present & torch.isfinite(out[pos])), k)
        c.values = out
        if c.ids is None and name in CUTS:
            finite = torch.isfinite(out).nonzero().flatten()  # (n,), in vocabulary order
            if 0 < finite.numel() <= COMPACT:  # none left: the run ends there (step_stats)
                c.values, c.ids = out[finite], finite
    return c


def final_probs(logits: torch.Tensor, params: SamplingParams, state: RunState | None) -> torch.Tensor:
    """softmax(final_logits): the distribution sampled from. Greedy keeps one token, whose
    probability every later stage leaves at 1: its one-hot is made directly, without the passes
    over the vocabulary that masking and a softmax would cost."""
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, greedy_logits(logits, params, state).argmax(dim=-1, keepdim=True), 1.0)
    return final_logits(logits, params, state).softmax(dim=-1)


def greedy_logits(logits: torch.Tensor, params: SamplingParams, state: RunState | None) -> torch.Tensor:
    """What greedy decoding takes the argmax of (the first of equal maxima): the logits after
    the stages that run before temperature (temperature 0 keeps one token, which no later
    filter removes), and the constraint wherever it stands: greedy takes the most likely token
    the constraint allows."""
    constrained = False
    for name, _, fn in stages(params, state):
        if name == "temperature":
            break
        logits = fn(logits)
        constrained |= name == "constraint"
    return logits if constrained else constrain.apply_constraint(logits, params, state)


# What a draw from a distribution that is not one says (a row whose stages overflowed float32 to
# infinities and NaN): the run ends with it, never with an index past the vocabulary.
NO_DISTRIBUTION = ("the sampling settings left no distribution to draw from: their numbers overflowed float32 "
                   "(a repetition penalty near 0 or a logit bias too large); move them toward their neutral values")


def sample(probs: torch.Tensor, generator: torch.Generator, u: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one token id per row of probs (bsz, vocab) -> (bsz, 1).

    Inverse transform: one uniform number u per row, and the first token whose cumulative
    probability exceeds u * total. Exact for the distribution given; one random number a row
    where torch.multinomial draws one per token (1.4 ms for 49,152 tokens on a CPU). Sums in
    float64, so a tail of 1e-9 keeps its share; a token of probability 0 is never drawn.
    `u` (bsz,) float64: the uniform numbers, already drawn from `generator` (kernels.draw_rows
    draws the same tokens for them).
    """
    cdf = probs.double().cumsum(dim=-1)  # (bsz, vocab)
    total = cdf[:, -1:]  # (bsz, 1)
    u = (torch.rand(total.shape, generator=generator, dtype=torch.float64, device=probs.device) if u is None
         else u.to(probs.device).view(total.shape))
    # Strictly below the total even if u * total rounds up to it: the last cdf entry then exceeds it.
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)  # (bsz, 1)
