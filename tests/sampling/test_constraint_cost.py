"""What a constraint costs (sampling/constraint_cost.py, in each sampled step): the KL divergence
between the constrained and the free final distributions, the chosen token's free probability,
the free distribution's top tokens the constraint forbade, and a run's log-probability with and
without the renormalisation, against a hand computation in numpy from the same logits: the
distributions written out from their definitions (softmax of logits / T; top-k; the mask)."""

import json
import math

import numpy as np
import pytest
import torch

from inference.events import DoneEvent, StepEvent
from inference.sampling.params import SamplingParams
from inference.sampling.state import RunState
from inference.serving.step_stats import RowSampling, pick_rows

V = 12
LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.3, -0.4, 0.9, 3.1, -1.0, 0.0, 2.6, -2.0, 1.1])
ALLOWED = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 1], dtype=torch.bool)  # forbids 6 and 9, the top two


class Mask:
    """A constraint's matcher reduced to what a step reads: the tokens it allows."""
    allowed = ALLOWED


def step(params: SamplingParams, seed: int = 0, top_n: int = 5):
    state = RunState.at(SamplingParams(), [3], [], V)
    state.constraint = Mask()
    g = torch.Generator().manual_seed(seed)
    return pick_rows(LOGITS.clone().unsqueeze(0), [RowSampling(params, state, g, top_n)])[0]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def hand_kl(c: np.ndarray, f: np.ndarray) -> float:
    on = c > 0
    if (f[on] == 0).any():
        return math.inf
    return float((c[on] * np.log(c[on] / f[on])).sum())


def regex(**kw) -> SamplingParams:
    return SamplingParams(constraint="regex", constraint_text="[a-z]+", **kw)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_a_constraint_after_the_stages_costs_minus_log_of_the_free_mass_it_allows(temperature):
    info = step(regex(temperature=temperature), seed=1)
    x = LOGITS.double().numpy()
    free = softmax(x / temperature)
    constrained = softmax(np.where(ALLOWED.numpy(), x / temperature, -np.inf))
    assert info.constraint_kl == pytest.approx(hand_kl(constrained, free), rel=1e-6)
    assert info.constraint_kl == pytest.approx(-math.log(free[ALLOWED.numpy()].sum()), rel=1e-6)
    assert info.free_prob == pytest.approx(free[info.token_id], rel=1e-5)
    assert info.prob == pytest.approx(constrained[info.token_id], rel=1e-5)
    # The free distribution's top 5 (6, 9, 0, 1, 2), those the constraint forbids: 6, 9 and 1.
    assert [i for i, _, _ in info.constraint_removed] == [6, 9, 1]
    for i, p, raw in info.constraint_removed:
        assert p == pytest.approx(free[i], rel=1e-5) and raw == pytest.approx(softmax(x)[i], rel=1e-6)


def test_a_cutoff_after_the_constraint_can_keep_a_token_the_free_stages_remove_an_infinite_kl():
    # Constraint first, then top-k 3: constrained keeps 0, 2, 11 (the best allowed); free keeps 6, 9, 0.
    params = regex(temperature=1.0, top_k=3, sampler_order="constraint")
    for seed in range(12):
        info = step(params, seed)
        x = LOGITS.double().numpy()
        keep_free = np.argsort(-x)[:3]
        free = np.zeros(V)
        free[keep_free] = softmax(x[keep_free])
        allowed = np.where(ALLOWED.numpy())[0]
        keep_c = allowed[np.argsort(-x[allowed])[:3]]
        constrained = np.zeros(V)
        constrained[keep_c] = softmax(x[keep_c])
        assert hand_kl(constrained, free) == math.inf and info.constraint_kl == math.inf
        assert info.free_prob == pytest.approx(free[info.token_id], abs=1e-7)
        assert [i for i, _, _ in info.constraint_removed] == [6, 9]


def test_with_top_k_after_a_last_constraint_the_kl_is_finite_over_the_kept_tokens():
    params = regex(temperature=0.9, top_k=5, sampler_order="top_k,constraint")  # the constraint after top-k
    info = step(params, seed=4)
    x = LOGITS.double().numpy() / 0.9
    keep = np.argsort(-x)[:5]  # 6, 9, 0, 1, 2
    free = np.zeros(V)
    free[keep] = softmax(x[keep])
    kept = [i for i in keep if ALLOWED[i]]
    constrained = np.zeros(V)
    constrained[kept] = softmax(x[kept])
    assert info.constraint_kl == pytest.approx(hand_kl(constrained, free), rel=1e-6)
    assert info.free_prob == pytest.approx(free[info.token_id], rel=1e-5)


def test_greedy_costs_nothing_where_the_argmax_is_allowed_and_infinitely_where_it_is_not():
    info = step(regex(temperature=0.0))
    assert info.token_id == 0  # the most likely allowed token; the free argmax is 6
    assert info.constraint_kl == math.inf and info.free_prob == 0.0
    assert [(i, p) for i, p, _ in info.constraint_removed] == [(6, 1.0)]
    allowed_top = ALLOWED.clone()
    allowed_top[6] = True
    Mask.allowed = allowed_top
    try:
        info = step(regex(temperature=0.0))
        assert info.token_id == 6 and info.constraint_kl == 0.0 and info.free_prob == 1.0
        assert info.constraint_removed == []
    finally:
        Mask.allowed = ALLOWED


def test_an_unconstrained_step_reports_no_cost():
    g = torch.Generator().manual_seed(0)
    state = RunState.at(SamplingParams(), [3], [], V)
    info = pick_rows(LOGITS.unsqueeze(0), [RowSampling(SamplingParams(temperature=1.0), state, g, 5)])[0]
    assert info.constraint_kl is None and info.free_prob is None and info.constraint_removed is None


# ---------------------------------------------------------------- a whole run on the tiny model
def test_a_runs_totals_sum_its_steps_and_each_step_matches_its_replayed_logits(tiny_engine):
    from inference.sampling.replay import replay_state
    from inference.sampling.stages import final_logits

    e = tiny_engine
    params = SamplingParams(temperature=1.0, seed=11, max_new_tokens=8, constraint="regex",
                            constraint_text="[a-z ]{3,20}")
    ids = e.prompt_ids("The quick brown")
    events = list(e.generate_ids(ids, params, top_n=5))
    steps, done = [ev for ev in events if isinstance(ev, StepEvent)], events[-1]
    assert isinstance(done, DoneEvent) and steps
    assert done.logprob == pytest.approx(sum(math.log(s.prob) for s in steps), abs=1e-9)
    assert done.free_logprob == pytest.approx(sum(math.log(s.free_prob) for s in steps), abs=1e-9)
    assert done.free_logprob < done.logprob  # the renormalisation raised every token's probability
    for k, s in enumerate(steps):
        before = [t.token_id for t in steps[:k]]
        logits = e.step_logits(ids + before)  # a second pass over the same text: within 1e-4 of the run's
        state = replay_state(params, params, ids, before, e.cfg.vocab_size, params.seed, s.sampler_state, e.tokenizer)
        allowed = state.constraint.allowed.numpy()
        free = softmax(logits.double().numpy())
        constrained = softmax(np.where(allowed, logits.double().numpy(), -np.inf))
        assert s.constraint_kl == pytest.approx(hand_kl(constrained, free), abs=1e-4)
        assert s.free_prob == pytest.approx(free[s.token_id], abs=1e-4)
        assert final_logits(logits, params, state)[s.token_id].isfinite()
        hand_removed = [int(i) for i in np.argsort(-free, kind="stable")[:5] if not allowed[i]]
        assert [c.id for c in s.constraint_removed] == hand_removed
        assert all(c.forbidden and c.removed_by == "constraint" for c in s.constraint_removed)
        line = s.to_json()
        assert line["constraint_kl"] == s.constraint_kl and line["constraint_removed"][0]["id"] == hand_removed[0]
    assert json.loads(json.dumps(done.to_json()))["free_logprob"] == done.free_logprob
    plain = [ev for ev in e.generate_ids(ids, SamplingParams(temperature=1.0, seed=11, max_new_tokens=3))
             if isinstance(ev, (StepEvent, DoneEvent))]
    assert "constraint_kl" not in plain[0].to_json() and plain[-1].logprob is None
