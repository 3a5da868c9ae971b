"""Sampling stages against hand-computed sets and transformers' logits processors."""

import math

import pytest
import torch

from inference.sampling.state import RunState

from inference.errors import InputError
from inference.sampling.params import SamplingParams
from inference.sampling.stages import (TOP_P_FIRST, apply_min_p, apply_repetition_penalty, apply_temperature,
                                       apply_top_k, apply_top_p, final_logits, sample)

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS = PROBS.log()


def kept(logits):
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


def test_temperature_zero_is_argmax():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    out = apply_temperature(logits, 0.0)
    assert kept(out) == {int(logits.argmax())}
    assert out.softmax(-1)[logits.argmax()] == 1.0


def test_temperature_scales_logits():
    assert torch.allclose(apply_temperature(LOGITS, 2.0), LOGITS / 2)


@pytest.mark.parametrize("k, expected", [(1, {0}), (2, {0, 1}), (3, {0, 1, 2}), (0, {0, 1, 2, 3}), (9, {0, 1, 2, 3})])
def test_top_k_keeps_the_k_largest(k, expected):
    assert kept(apply_top_k(LOGITS, k)) == expected


@pytest.mark.parametrize("p, expected", [
    (0.4, {0}),          # the top token alone reaches 0.4
    (0.5, {0}),          # exactly reached by the first token
    (0.79, {0, 1}),      # 0.5 < 0.79 needs the second
    (0.81, {0, 1, 2}),   # 0.8 < 0.81 needs the third
    (1e-9, {0}),         # always at least one
    (1.0, {0, 1, 2, 3}),
])
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
    assert kept(apply_top_p(LOGITS, p)) == expected


@pytest.mark.parametrize("m, expected", [(0.0, {0, 1, 2, 3}), (0.3, {0, 1, 2}), (0.4, {0, 1}),
                                         (0.61, {0}), (1.0, {0})])
def test_min_p_keeps_tokens_above_fraction_of_top(m, expected):
    # thresholds: 0.3 * 0.5 = 0.15 keeps 0.15; 0.4 * 0.5 = 0.2 drops it
    assert kept(apply_min_p(LOGITS, m)) == expected


def test_repetition_penalty_convention():
    logits = torch.tensor([2.0, -2.0, 1.0, -1.0])
    seen = torch.tensor([True, True, False, False])
    out = apply_repetition_penalty(logits, 2.0, seen)
    assert out.tolist() == [1.0, -4.0, 1.0, -1.0]


def test_against_transformers_processors():
    tf = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        logits = torch.randn(1, 500, generator=g) * 3
        ids = torch.randint(0, 500, (1, 30), generator=g)
        seen = torch.zeros(500, dtype=torch.bool)
        seen[ids[0]] = True
        ref = tf.RepetitionPenaltyLogitsProcessor(1.3)(ids, logits.clone())
        assert torch.allclose(apply_repetition_penalty(logits[0], 1.3, seen), ref[0])
        assert kept(apply_top_k(logits[0], 17)) == kept(tf.TopKLogitsWarper(17)(ids, logits.clone())[0])
        assert kept(apply_top_p(logits[0], 0.9)) == kept(tf.TopPLogitsWarper(0.9)(ids, logits.clone())[0])
        assert kept(apply_min_p(logits[0], 0.05)) == kept(tf.MinPLogitsWarper(0.05)(ids, logits.clone())[0])


@pytest.mark.parametrize("scale", [0.05, 1.0, 6.0])  # flat, as a small model: the set is larger than TOP_P_FIRST; peaked: a few
def test_top_p_on_a_full_vocabulary_matches_transformers(scale):
    tf = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 49152, generator=g) * scale
    ref = tf.TopPLogitsWarper(0.9)(torch.zeros(2, 1, dtype=torch.long), logits.clone())
    ours = apply_top_p(logits, 0.9)
    for row in range(2):
        assert kept(ours[row]) == kept(ref[row])
    assert (len(kept(ours[0])) > TOP_P_FIRST) == (scale < 6)


def test_sample_draws_each_token_as_often_as_its_probability():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.0, 0.05])
    n = 40_000
    draws = sample(probs.expand(n, -1), torch.Generator().manual_seed(0))[:, 0]  # one draw per row
    counts = torch.bincount(draws, minlength=6).double()
    assert counts[1] == 0 and counts[4] == 0  # never a token of probability 0
    sigma = (probs * (1 - probs) / n).sqrt().double()
    assert ((counts / n - probs.double()).abs() <= 4 * sigma + 1e-12).all(), counts / n


def test_sample_follows_its_generator():
    probs = torch.softmax(torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)), -1)
    a = [sample(probs, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(a[0], a[1])
    g = torch.Generator().manual_seed(7)
    assert torch.equal(sample(probs, g), a[0])
    assert not torch.equal(sample(probs, g), a[0])  # the generator moved on


def test_sample_never_rounds_past_the_last_token():
    probs = torch.tensor([[0.25, 0.75, 0.0]])
    g = torch.Generator().manual_seed(0)
    assert set(torch.cat([sample(probs, g) for _ in range(2000)]).flatten().tolist()) == {0, 1}


def test_final_distribution_sums_to_one_and_respects_all_filters():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1000, generator=g) * 2
    seen = torch.zeros(1000, dtype=torch.bool)
    params = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.02, repetition_penalty=1.2)
    probs = final_logits(logits, params, RunState.from_seen(seen)).softmax(-1)
    assert math.isclose(probs.sum().item(), 1.0, rel_tol=1e-5)
    assert 1 <= (probs > 0).sum().item() <= 50


@pytest.mark.parametrize("kwargs", [
    dict(temperature=float("nan")), dict(temperature=float("inf")), dict(temperature=-0.1),
    dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(min_p=-0.1), dict(min_p=1.1),
    dict(repetition_penalty=0.0), dict(max_new_tokens=0), dict(seed=-1),
    dict(stop=("x" * 1000,)), dict(stop=tuple(str(i) for i in range(100))), dict(stop=("",)),
])
def test_bad_settings_raise_a_clear_error(kwargs):
    with pytest.raises(InputError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("penalty", [1.0, 1.5])
@pytest.mark.parametrize("filters", [{}, {"top_k": 3}, {"top_p": 0.5}, {"min_p": 0.2}])
def test_greedy_distribution_made_directly_is_the_stages_one_hot(penalty, filters):
    """final_probs' shortcut for temperature 0 equals every stage run and a softmax, exactly."""
    from inference.sampling.stages import final_logits, final_probs
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(300, generator=g) * 3
    seen = torch.zeros(300, dtype=torch.bool)
    seen[logits.topk(4).indices[:2]] = True  # the penalty can move the argmax
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty, **filters)
    expected = final_logits(logits, params, RunState.from_seen(seen)).softmax(dim=-1)
    assert torch.equal(final_probs(logits, params, RunState.from_seen(seen)), expected)
    assert expected.max() == 1.0


def test_rows_picked_together_equal_rows_picked_alone():
    """pick_rows over a batch mixing greedy (with and without a repetition penalty) and sampled
    rows gives each row what it gets alone, and greedy rows their hand-computed argmax."""
    from inference.serving.step_stats import RowSampling, pick_rows
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(5, 300, generator=g) * 3
    seen = torch.zeros(300, dtype=torch.bool)
    seen[logits[1].argmax()] = True  # the penalty moves row 1's choice
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, repetition_penalty=2.0),
              SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, top_k=5)]

    def rows():
        return [RowSampling(p, RunState.from_seen(seen), torch.Generator().manual_seed(i), 4) for i, p in enumerate(params)]
    together = pick_rows(logits, rows())
    alone = [pick_rows(logits[i:i + 1], [r])[0] for i, r in enumerate(rows())]
    assert together == alone
    assert together[0].token_id == int(logits[0].argmax()) and together[0].prob == 1.0
    assert together[1].token_id != int(logits[1].argmax())
    penalized = torch.where(seen, torch.where(logits[1] > 0, logits[1] / 2, logits[1] * 2), logits[1])
    assert together[1].token_id == int(penalized.argmax())


def test_rows_drawn_together_by_the_kernel_draw_what_sample_draws(monkeypatch):
    """Rows drawn over the whole vocabulary (kernels.draw_rows, in one call) against the same rows
    drawn by sample() one by one (no kernels): the same tokens from the same seeds, the same
    generators' states after, and each row's final probability outside its candidates and its
    token (a forced row: the given token, not the one drawn) to float64 rounding."""
    from inference.model import kernels
    from inference.serving.step_stats import RowSampling, pick_rows
    if not kernels.available():
        pytest.skip("no C compiler here: torch's operators serve")
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(6, 3000, generator=g) * 2.5  # (6, 3000)
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7), SamplingParams(temperature=1.3),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, presence_penalty=0.5),
              SamplingParams(temperature=1.0)]
    seen = torch.zeros(3000, dtype=torch.bool)
    seen[::7] = True

    def pick(seed):
        rows = [RowSampling(p, RunState.from_seen(seen), torch.Generator().manual_seed(seed + i), 10,
                            forced=5 if i == 5 else None) for i, p in enumerate(params)]
        return pick_rows(logits, rows), [r.generator.get_state() for r in rows]
    for seed in range(20):
        fast, fast_gen = pick(seed)
        with monkeypatch.context() as m:
            m.setattr(kernels, "draw_rows", lambda *a: None)
            slow, slow_gen = pick(seed)
        assert [a.token_id for a in fast] == [b.token_id for b in slow]
        assert all(torch.equal(x, y) for x, y in zip(fast_gen, slow_gen))
        assert fast[5].token_id == 5
        for a, b in zip(fast, slow):
            assert (a.prob, a.top) == (b.prob, b.top)
            assert a.unlisted_prob == pytest.approx(b.unlisted_prob, rel=1e-12, abs=1e-15)
            assert a.unlisted_prob == pytest.approx(1 - a.prob - sum(p for i, p, _ in a.top if i != a.token_id),
                                                    abs=1e-6)


def test_a_steps_numbers_are_the_same_with_and_without_the_cpu_kernels(monkeypatch):
    """pick_rows through the CPU kernels (top-k, sums, argmax from the top-k) against torch's
    operators alone, on rows with ties at the top: the same tokens and ranks, candidates of the
    same probabilities (equal ones by id through the kernels: torch.topk orders ties as it
    finds them), probabilities and entropies to float64 rounding; and against a float64 softmax."""
    from inference.model import kernels
    from inference.serving.step_stats import RowSampling, pick_rows
    if not kernels.available():
        pytest.skip("no C compiler here: torch's operators serve")
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(6, 500, generator=g) * 4).round() / 2  # (6, 500): ties, also at the top
    seen = torch.zeros(500, dtype=torch.bool)
    seen[:40] = True
    seen[logits[1].argmax()] = True  # the penalty moves row 1's choice
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, repetition_penalty=1.5),
              SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.2, min_p=0.05)]

    def pick(top_ns):
        rows = [RowSampling(p, RunState.from_seen(seen), torch.Generator().manual_seed(i), n)
                for i, (p, n) in enumerate(zip(params, top_ns))]
        return pick_rows(logits, rows)
    for top_ns in ([5, 5, 5, 5, 5, 5], [0, 3, 10, 1, 500, 7], [0] * 6):
        fast = pick(top_ns)
        with monkeypatch.context() as m:
            m.setattr(kernels, "_library", lambda: None)
            slow = pick(top_ns)
        for a, b, x, n in zip(fast, slow, logits, top_ns):
            assert (a.token_id, a.rank, len(a.top)) == (b.token_id, b.rank, len(b.top))
            order = torch.sort(-x, stable=True).indices.tolist()  # ties by id
            assert [t[0] for t in a.top[:n]] == order[:n]
            assert [t[2] for t in a.top] == pytest.approx([t[2] for t in b.top], rel=1e-12)
            theirs = {i: (p, r) for i, p, r in b.top}
            for i, p, r in a.top:  # a candidate both list: the same numbers
                assert i not in theirs or (p, r) == pytest.approx(theirs[i], rel=1e-12)
            for u, v in ((a.prob, b.prob), (a.raw_prob, b.raw_prob), (a.entropy, b.entropy)):
                assert u == pytest.approx(v, rel=1e-12, nan_ok=True)
            if n:  # what the candidates leave, summed in float64 in two orders
                assert a.unlisted_prob == pytest.approx(b.unlisted_prob, rel=1e-12, abs=1e-15)
            if a.top:
                p = x.double().softmax(-1)
                assert a.raw_prob == pytest.approx(float(p[a.token_id]), rel=1e-6)
                assert a.entropy == pytest.approx(float(-(p * p.log()).sum()), rel=1e-6)
                assert a.rank == 1 + int((x > x[a.token_id]).sum())
    assert fast[0].token_id == int(logits[0].argmax()) and fast[4].token_id == int(logits[4].argmax())
    assert fast[1].token_id != int(logits[1].argmax())
