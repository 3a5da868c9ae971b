"""Speculative decoding (inference/decoding/speculative.py, drafters.py): greedy runs equal plain
greedy runs for every drafter; sampled runs draw the first two tokens from the model's own
distribution (a seeded chi-square test, which a wrong residual rule fails); step 0's numbers are
the plain run's."""

import json

import pytest
import torch

from inference.cli import main
from inference.decoding.drafters import make_drafter
from inference.decoding.speculative import SpecStepEvent, Speculator, residual
from inference.errors import InputError
from inference.events import StepEvent
from inference.request import prepare_run
from inference.sampling.stages import final_probs
from ui.samples.stats import chi2_sf

PROMPT = "The quick brown fox jumps over the quick brown"  # a repeat: prompt lookup finds n-grams


@pytest.fixture(scope="module")
def draft_engine(tiny_dirs):
    """A second tiny model with the same tokenizer (other weights)."""
    from inference.serving.engine import Engine
    with Engine.from_hf_dir(tiny_dirs["mha"], device="cpu", dtype="float32") as engine:
        yield engine


def drafter(engine, spec, draft_engine, request, k):
    return make_drafter(spec, engine, len(request.ids) + request.max_new + k + 1, lambda name: draft_engine)


def spec_run(engine, spec, draft_engine, settings, k=3, rule=residual, prompt=PROMPT, seed=None):
    request = prepare_run(engine, settings, prompt=prompt, seed=seed)
    events = list(Speculator(engine, drafter(engine, spec, draft_engine, request, k), k, rule).run(request))
    return request, [e for e in events if isinstance(e, SpecStepEvent)], events[-1]


@pytest.mark.parametrize("spec", ["prompt-lookup", "early-exit:1", "model:mha"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_is_plain_greedy_token_for_token(tiny_engine, draft_engine, spec, k):
    saved = tiny_engine.eos_ids
    tiny_engine.eos_ids = set()  # random weights: every run goes to the cap, all of it compared
    try:
        for prompt in (PROMPT, "Once upon a time"):
            settings = {"temperature": 0, "max_new_tokens": 24}
            request, steps, done = spec_run(tiny_engine, spec, draft_engine, settings, k, prompt=prompt)
            plain = [e for e in tiny_engine.run(prepare_run(tiny_engine, settings, prompt=prompt)) if isinstance(e, StepEvent)]
            assert [e.token_id for e in steps] == [e.token_id for e in plain]
            assert done.text == "".join(e.text for e in plain) and done.generated_tokens == 24
            assert max(abs(a.raw_prob - b.raw_prob) for a, b in zip(steps, plain)) < 1e-4
            assert done.rounds == sum(1 for s in steps if s.accepted is not True)  # one pass per round
            if spec != "model:mha":  # the same model's layers, or the text's own repeats: some are accepted
                assert done.accepted > 0
    finally:
        tiny_engine.eos_ids = saved


def test_step_0_shows_the_plain_runs_probabilities(tiny_engine, draft_engine):
    settings = {"temperature": 0.8, "top_k": 20, "max_new_tokens": 3}
    _, steps, _ = spec_run(tiny_engine, "early-exit:1", draft_engine, settings, seed=7)
    plain = [e for e in tiny_engine.run(prepare_run(tiny_engine, settings, prompt=PROMPT, top_n=5, seed=7))
             if isinstance(e, StepEvent)][0]
    first = steps[0]
    assert [c.id for c in first.top] == [c.id for c in plain.top][:5]  # (the plain run adds its chosen token)
    assert max(max(abs(a.prob - b.prob), abs(a.raw_prob - b.raw_prob)) for a, b in zip(first.top, plain.top)) < 1e-4


def first_two(engine, draft_engine, rule, n, settings):
    """The first two tokens of n seeded speculative runs (early exit after layer 1, 2 proposals)."""
    counts = {}
    for seed in range(n):
        request = prepare_run(engine, settings, prompt="The quick brown fox", seed=seed)
        run = Speculator(engine, drafter(engine, "early-exit:1", draft_engine, request, 2), 2, rule).run(request)
        pair = tuple(next(run).token_id for _ in range(2))
        run.close()
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def exact_pairs(engine, settings) -> dict:
    """P(t1, t2) = p(t1 | prompt) p(t2 | prompt, t1): the model's own, from its forward passes."""
    request = prepare_run(engine, settings, prompt="The quick brown fox")  # the model's defaults too
    params, ids = request.params, list(request.ids)
    p1 = final_probs(engine.step_logits(ids), params, None).double()
    out = {}
    for t1 in torch.nonzero(p1).flatten().tolist():
        p2 = final_probs(engine.step_logits(ids + [t1]), params, None).double()
        for t2 in torch.nonzero(p2).flatten().tolist():
            out[(t1, t2)] = float(p1[t1] * p2[t2])
    return out


def chi_square(counts, exact, n):
    """Pearson's chi-square over the pairs expected at least 5 times, the rest pooled; its p-value."""
    big = [c for c, p in exact.items() if p * n >= 5]
    observed = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    expected = [exact[c] * n for c in big] + [n - sum(exact[c] * n for c in big)]
    if expected[-1] < 5:  # too small a pool: joined to the last cell
        observed[-2:], expected[-2:] = [sum(observed[-2:])], [sum(expected[-2:])]
    x = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return chi2_sf(x, len(observed) - 1)


SAMPLED = {"temperature": 1.0, "top_k": 4, "max_new_tokens": 3}  # 16 pairs: every cell well filled
DRAWS = 2000


@pytest.fixture(scope="module")
def exact(tiny_engine):
    return exact_pairs(tiny_engine, SAMPLED)


@pytest.mark.slow
def test_sampled_speculative_draws_the_models_own_first_two_tokens(tiny_engine, draft_engine, exact):
    counts = first_two(tiny_engine, draft_engine, residual, DRAWS, SAMPLED)
    assert set(counts) <= set(exact)  # nothing the model gives probability 0
    assert chi_square(counts, exact, DRAWS) > 0.01


def wrong_residual(p, q, draft):
    """A deliberately wrong rule: after a rejection, draw from p instead of (p - q)+."""
    return p.double()


@pytest.mark.slow
def test_the_same_test_fails_a_wrong_residual_rule(tiny_engine, draft_engine, exact):
    counts = first_two(tiny_engine, draft_engine, wrong_residual, DRAWS, SAMPLED)
    assert chi_square(counts, exact, DRAWS) < 1e-6


def test_settings_speculative_decoding_cannot_honour_are_refused(tiny_engine, draft_engine):
    request = prepare_run(tiny_engine, {"repetition_penalty": 1.3}, prompt="Hi")
    with pytest.raises(InputError, match="repetition_penalty"):
        list(Speculator(tiny_engine, drafter(tiny_engine, "prompt-lookup", draft_engine, request, 2), 2).run(request))
    for bad in ("early-exit:2", "early-exit:x", "lookahead", "model:"):
        with pytest.raises(InputError):
            make_drafter(bad, tiny_engine, 64, lambda name: draft_engine)


def test_cli_lines_say_what_was_proposed_and_accepted(tiny_dirs, capsys):
    base = ["generate", "--model", str(tiny_dirs["gqa_tied"]), "--device", "cpu", "--dtype", "float32",
            "--prompt", PROMPT, "--max-new-tokens", "10", "--seed", "3", "--speculative", "early-exit:1",
            "--draft-tokens", "3", "--jsonl"]
    assert main(base) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    steps, summary = lines[:-1], lines[-1]
    assert all({"proposed", "accepted", "target_prob", "draft_prob", "coin", "prob"} <= set(s) for s in steps)
    proposed = [s for s in steps if s["proposed"] is not None]
    assert proposed and all(s["coin"] is not None for s in proposed)
    for s in proposed:  # the rule, as printed: accepted exactly when u < min(1, p/q)
        assert s["accepted"] == (s["coin"] < min(1.0, s["target_prob"] / s["draft_prob"]))
        assert (s["token_id"] == s["proposed"]) or not s["accepted"]
    assert summary["accepted"] == sum(1 for s in steps if s["accepted"]) and summary["proposed"] >= len(proposed)
    assert summary["generated_tokens"] == len(steps) and summary["drafter"] == "early-exit:1"
    # Measured against plain decoding of the same request, just after (sampled: no text compared).
    assert summary["tokens_per_s"] > 0 and summary["plain_tokens_per_s"] > 0 and summary["same_as_plain"] is None
    assert summary["speed_up"] == pytest.approx(summary["tokens_per_s"] / summary["plain_tokens_per_s"])
    assert main([*base[:-1], "--temperature", "0"]) == 0  # greedy: the same text as plain decoding, said
    assert "the same text]" in capsys.readouterr().err


@pytest.mark.parametrize("k", [7, 9])  # 8 rows: the one-call kernel's most; 10: the layers' own path
@pytest.mark.parametrize("kernels_on", [True, False])
def test_a_round_is_rows_of_one_sequence_on_a_sliding_window_family(tmp_path, sp_model_bytes, k, kernels_on,
                                                                    monkeypatch):
    """A round's k+1 rows through the paged step, on Gemma 3's shape (sliding windows of 8
    positions, which the run outgrows; per-head q/k norms) and with the kernels off (attention
    by the decode mask): the text is plain greedy decoding's and the probabilities its own."""
    from inference.model import kernels
    from inference.serving.engine import Engine
    from tiny_families import make_family_model

    if not kernels_on:
        monkeypatch.setattr(kernels, "_library", lambda: None)
    d, _ = make_family_model(tmp_path, "gemma3_text", sp_model_bytes, final_logit_softcapping=None)
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as engine:
        engine.eos_ids = set()
        settings = {"temperature": 0, "max_new_tokens": 30}
        prompt = "one two three one two three one two three one two"
        request, steps, done = spec_run(engine, "early-exit:2", None, settings, k, prompt=prompt)
        plain = [e for e in engine.run(prepare_run(engine, settings, prompt=prompt)) if isinstance(e, StepEvent)]
    assert len(request.ids) + 30 > 8  # past the window
    assert [e.token_id for e in steps] == [e.token_id for e in plain]
    assert max(abs(a.raw_prob - b.raw_prob) for a, b in zip(steps, plain)) < 1e-4
    assert done.accepted > 0 and done.rounds < 30  # rounds of several rows were taken
