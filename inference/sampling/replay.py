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
from inference.sampling.state import RunState


@dataclass
class StageStat:
    name: str  # the stage's label
    kept: int  # candidates left
    mass_removed: float  # probability mass this stage removed (of the distribution entering it)
    chosen_rank: int | None  # 1 = most likely; None when this stage removed the chosen token
    chosen_prob: float  # in this stage's renormalized distribution
    note: str = ""  # what the stage read from the run's state this step (XTC's coin, μ)
    key: str = ""  # the stage's setting name ("raw", "final" for the two ends)
    off: bool = False  # listed though these settings leave it at its neutral value (it changes nothing)


def _stat(name: str, logits: torch.Tensor, removed_mass: float, chosen: int, note: str = "",
          key: str = "") -> StageStat:
    probs = logits.softmax(-1)
    kept = int(torch.isfinite(logits).sum())
    alive = bool(torch.isfinite(logits[chosen]))
    rank = int((logits > logits[chosen]).sum()) + 1 if alive else None
    return StageStat(name, kept, removed_mass, rank, float(probs[chosen]) if alive else 0.0, note, key or name)


def masked_mass(raw_logits: torch.Tensor, state: RunState | None) -> float | None:
    """The raw probability mass the run's constraint forbids at this step (None: no constraint)."""
    if state is None or state.constraint is None:
        return None
    allowed = state.constraint.allowed.to(raw_logits.device)
    return float(raw_logits.double().softmax(-1)[~allowed].sum())


def _note(name: str, params: SamplingParams, state: RunState | None, raw: torch.Tensor) -> str:
    """What a stage read from the run's state this step, in words."""
    if state is None:
        return ""
    if name == "constraint" and state.constraint is not None:
        allowed = int(state.constraint.allowed.sum())
        return f"allows {allowed:,} tokens; raw mass forbidden {masked_mass(raw, state):.4g}"
    if name == "xtc_probability" and state.coin is not None:
        fell = "acts" if state.coin < params.xtc_probability else "does not act"
        return f"coin {state.coin:.3f} vs p {params.xtc_probability:g}: {fell}"
    if name == "mirostat_tau" and state.mu is not None:
        return f"μ {state.mu:.3f} bits"
    return ""


def pipeline(logits: torch.Tensor, params: SamplingParams, state: RunState | None,
             chosen: int, shown=None) -> tuple[list[StageStat], torch.Tensor]:
    """Every stage of sampling on a (vocab,) logit vector, in the run's order: what it left and
    where `chosen` stood. Returns the stages listed (`shown`: stage names; None: those the
    settings move from neutral) and the final distribution; every stage runs, as in
    sampling.final_logits."""
    shown = set(params.changed if shown is None else shown)
    raw, stats = logits, [_stat("raw", logits, 0.0, chosen)]
    for name, label, fn in stages(params, state):
        before = logits.softmax(-1)
        logits = fn(logits)
        if name in shown:
            removed = float(before[~torch.isfinite(logits)].sum())
            stats.append(_stat(label, logits, removed, chosen, _note(name, params, state, raw), name))
            stats[-1].off = name not in params.changed
    final = logits.softmax(-1)
    stats.append(_stat("final (renormalized)", logits, 0.0, chosen, key="final"))
    return stats, final


def replay_state(params: SamplingParams, run_params: SamplingParams, prompt_ids: list[int],
                 generated: list[int], vocab: int, seed: int, recorded: dict | None,
                 tokenizer=None) -> RunState:
    """The state step len(generated) of a run was sampled in, for a replay under `params`:
    rebuilt from the ids, with the μ the run recorded when its Mirostat settings are the
    replay's (another τ or η starts from its own 2τ)."""
    same_mirostat = (params.mirostat_tau, params.mirostat_eta) == (run_params.mirostat_tau, run_params.mirostat_eta)
    mu = (recorded or {}).get("mirostat_mu") if same_mirostat else None
    return RunState.at(params, prompt_ids, generated, vocab, seed, mu=mu, tokenizer=tokenizer)
