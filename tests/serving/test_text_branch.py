"""A run from any point of a scored text (request.prepare_from_text, through prepare_run): the
text before a token as the prompt, or a candidate put in that token's place. Its first step's
distribution is the one the score showed there, and a candidate's run is the branch the engine
makes of those ids."""

import pytest

from inference.errors import InputError
from inference.events import StepEvent
from inference.request import prepare_from_text
from inference.sampling.params import SamplingParams

TEXT = "The quick brown fox jumps over the lazy dog."


def steps(engine, request):
    return [e for e in engine.run(request) if isinstance(e, StepEvent)]


def test_a_run_from_a_token_starts_from_the_distribution_the_score_showed_there(tiny_engine):
    e = tiny_engine
    ids, before = e.text_ids(TEXT)
    scores = e.score_ids(ids, top_n=5)
    for at in (before + 1, len(ids) // 2, len(ids) - 1):
        request = prepare_from_text(e, {"temperature": 0, "max_new_tokens": 3}, ids, at, top_n=5)
        assert request.prompt_ids == tuple(ids[:at]) and request.given == ()
        first = steps(e, request)[0]
        shown = scores[at].top  # the candidates for token `at`, given the tokens before it
        assert [c.id for c in first.top] == [c.id for c in shown]
        # The run's prefill and the score's pass are two computations of one distribution.
        assert max(abs(a.raw_prob - b.raw_prob) for a, b in zip(first.top, shown)) < 1e-4
        assert first.token_id == shown[0].id


def test_a_candidate_put_in_a_tokens_place_is_the_branch_of_those_ids(tiny_engine):
    e = tiny_engine
    ids, _ = e.text_ids(TEXT)
    at = 4
    candidate = e.score_ids(ids, top_n=5)[at].top[2].id
    params = SamplingParams(temperature=1.0, max_new_tokens=6, repetition_penalty=1.2, seed=5)
    request = prepare_from_text(e, params, ids, at, candidate=candidate, top_n=5)
    assert request.ids == [*ids[:at], candidate] and request.given == (candidate,)
    branch = steps(e, request)
    same = [ev for ev in e.generate_ids(ids[:at], params, top_n=5, given=[candidate]) if isinstance(ev, StepEvent)]
    assert [s.token_id for s in branch] == [s.token_id for s in same]
    assert [s.prob for s in branch] == [s.prob for s in same]  # one computation: the same bits


def test_a_point_outside_the_text_or_a_token_outside_the_vocabulary_is_refused_in_one_line(tiny_engine):
    e = tiny_engine
    ids, _ = e.text_ids(TEXT)
    for at, says in [(0, "nothing before it"), (len(ids) + 1, f"has {len(ids)} tokens"), (True, "a token's place")]:
        with pytest.raises(InputError, match=says) as info:
            prepare_from_text(e, {}, ids, at)
        assert info.value.field == "at" and "\n" not in str(info.value)
    with pytest.raises(InputError, match="token ids must be integers"):
        prepare_from_text(e, {}, ids, 3, candidate=e.cfg.vocab_size)
    request = prepare_from_text(e, {"max_new_tokens": 2}, ids, len(ids))  # after the whole text
    assert request.prompt_ids == tuple(ids)
