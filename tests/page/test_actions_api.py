"""The new actions by name, as scripts call them with gradio_client: /continue_edit (the prompt,
the settings and the edited output) and /branch (this session's last run, a step and a
candidate), each with the checks and one-line refusals of /generate."""

import pytest

from inference.events import StepEvent
from inference.sampling.params import SamplingParams
from page_api import call, output
from ui.controls import NAMES

gradio_client = pytest.importorskip("gradio_client")


@pytest.fixture
def client(live_app):
    c = gradio_client.Client(live_app[0], verbose=False)
    yield c
    c.close()


def test_the_endpoints_name_their_parameters(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert [p["parameter_name"] for p in endpoints["/continue_edit"]["parameters"]] == [*NAMES, "edited_text"]
    assert [p["parameter_name"] for p in endpoints["/branch"]["parameters"]] == ["step", "token_id"]


def test_continue_edit_runs_after_the_edited_text(client, live_app):
    _, engine, _ = live_app
    edited = " jumps over"
    result = client.predict(*call(prompt="The quick", max_new_tokens=4), edited, api_name="/continue_edit")
    prompt_ids = engine.tokenizer.encode("The quick")
    given = engine.tokenizer.encode("The quick" + edited)[len(prompt_ids):]
    alone = [e for e in engine.generate_ids(prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=4, seed=5),
                                            given=given) if isinstance(e, StepEvent)]
    text = engine.tokenizer.decode(given + [s.token_id for s in alone])
    assert text.startswith(edited) and edited in output(result, "output")
    tokens = output(result, "api_tokens")
    assert "".join(t["token"] for t in tokens) == text[len(edited):]
    with pytest.raises(Exception, match="the edited text is empty"):
        client.predict(*call(), "", api_name="/continue_edit")
    with pytest.raises(Exception, match="Temperature must be in"):  # named as the page labels it
        client.predict(*call(temperature=-1.0), "x", api_name="/continue_edit")
    assert engine.active_runs == 0


def test_branch_continues_the_sessions_last_run(client, live_app):
    _, engine, _ = live_app
    with pytest.raises(Exception, match="no run to branch from: call /generate first"):
        client.predict(1, 5, api_name="/branch")
    run = client.predict(*call(prompt="The quick", max_new_tokens=6), api_name="/generate")
    prompt_ids = engine.tokenizer.encode("The quick")
    steps = [e for e in engine.generate_ids(prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=6, seed=5),
                                            top_n=10) if isinstance(e, StepEvent)]
    assert "".join(t["token"] for t in output(run, "api_tokens")) == "".join(s.text for s in steps)
    other = steps[2].top[1].id
    branch = client.predict(2, other, api_name="/branch")
    given = [s.token_id for s in steps[:2]] + [other]
    alone = [e for e in engine.generate_ids(prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=6, seed=5),
                                            given=given) if isinstance(e, StepEvent)]
    assert "".join(t["token"] for t in output(branch, "api_tokens")) == "".join(s.text for s in alone)
    with pytest.raises(Exception, match="step must be from 0 to"):
        client.predict(99, other, api_name="/branch")
    assert engine.active_runs == 0
