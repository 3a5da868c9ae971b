"""Token Lab in front of Token Lab: the remote engine (--engine-url) pointed at a Token Lab
page's /v1 works as in front of vLLM, and its numbers are the local engine's own."""

import json

import pytest

from inference.events import DoneEvent, StepEvent
from inference.sampling.params import SamplingParams

PROMPT = "The quick"


@pytest.fixture(scope="module")
def remote(live_app):
    from inference.remote.engine import RemoteEngine
    url, _, _ = live_app
    with RemoteEngine.connect(url + "/v1") as engine:
        yield engine


def run(engine, ids, params, top_n=5):
    events = list(engine.generate_ids(ids, params, top_n))
    return [e for e in events if isinstance(e, StepEvent)], events[-1]


def test_the_server_is_found_out_as_vllm_would_be(live_app, remote):
    _, local, _ = live_app
    info = remote.describe()
    assert info.name == local.name and info.max_seq_len == local.cfg.max_seq_len
    assert info.capabilities.logprobs == "raw" and info.logprobs_source == "probed at start"
    assert remote.prompt_ids(PROMPT) == local.prompt_ids(PROMPT)
    assert remote.prompt_ids("Hi", chat=True, system="Be brief.") == local.prompt_ids("Hi", chat=True, system="Be brief.")
    assert remote.tokenizer.pieces([5, 40, 300]) == {i: local.tokenizer.piece(i) for i in (5, 40, 300)}


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=7),
                                      dict(temperature=1.0, seed=3, repetition_penalty=1.3)])
def test_runs_through_the_server_are_the_local_engines(live_app, remote, settings):
    _, local, _ = live_app
    ids = local.prompt_ids(PROMPT)
    params = SamplingParams(max_new_tokens=10, seed=settings.pop("seed", 1), **settings)
    here, done_here = run(local, ids, params)
    there, done_there = run(remote, ids, params)
    assert [s.token_id for s in there] == [s.token_id for s in here]
    assert isinstance(done_there, DoneEvent) and done_there.text == done_here.text
    for a, b in zip(there, here):
        assert a.raw_prob == pytest.approx(b.raw_prob, rel=1e-12)
        assert [c.id for c in a.top[:5]] == [c.id for c in b.top[:5]]
        assert [c.raw_prob for c in a.top[:5]] == pytest.approx([c.raw_prob for c in b.top[:5]], rel=1e-12)


def test_a_stop_string_and_a_score_through_the_server(live_app, remote):
    _, local, _ = live_app
    ids = local.prompt_ids(PROMPT)
    text = run(local, ids, SamplingParams(temperature=1.0, max_new_tokens=12, seed=2))[1].text
    at = next(i for i in range(2, len(text) - 1) if text.find(text[i:i + 2]) == i)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=2, stop=(text[at:at + 2],))
    done = run(remote, ids, params)[1]
    assert done.reason == "stop" and done.text == text[:at] and done.stop_string == text[at:at + 2]
    there, here = remote.score(ids, " fox jumps"), local.score(ids, " fox jumps")
    assert [t[:2] for t in there] == [t[:2] for t in here] and len(here) > 3
    assert [t[2] for t in there] == pytest.approx([t[2] for t in here], abs=1e-6)


def test_the_cli_in_front_of_token_lab(live_app, capsys):
    from inference.cli import main
    url, local, _ = live_app
    assert main(["generate", "--engine-url", url + "/v1", "--prompt", PROMPT, "--temperature", "0",
                 "--max-new-tokens", "6", "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ids = local.prompt_ids(PROMPT)
    expected = run(local, ids, SamplingParams(temperature=0.0, max_new_tokens=6))
    assert [line["token_id"] for line in lines[:-1]] == [s.token_id for s in expected[0]]
    assert lines[-1]["text"] == expected[1].text
