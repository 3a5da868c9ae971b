"""Issue 59, finding 3: about 75 requests got a bare 500 or a dropped connection. Lone surrogates
("\\ud800") in a prompt, a stop string or a field's name; NaN and Infinity where an integer is
expected; a body nested 100,000 deep and a JSON schema nested 2,000 deep (RecursionError); a
gradio call naming fn_index 9999. Each now gets a 4xx with one line naming the field and what is
wrong, and nothing reaches the log as a traceback at ERROR level (the log and stderr captured)."""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import httpx
import pytest

from ui.controls import Controls
from served_page import page  # noqa: F401 - the fixture

DEEP_SCHEMA = '{"type":"object","properties":{"a":' * 2000 + '{"type":"string"}' + "}}" * 2000

# (path, raw body, the field the refusal names); every answer must be a 4xx naming it.
API = {
    "a lone surrogate in the prompt": ("/v1/completions", '{"prompt": "Hi \\ud800 there", "max_tokens": 2}', "prompt"),
    "a lone surrogate in a stop string": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "stop": ["\\udc00"]}',
                                          "stop"),
    "a lone surrogate in a field's name": ("/v1/completions", '{"prompt": "Hi", "\\ud800": 1}', "body"),
    "a lone surrogate in a message": ("/v1/chat/completions",
                                      '{"messages": [{"role": "user", "content": "\\ud83d"}], "max_tokens": 2}', "messages"),
    "a lone surrogate to tokenize": ("/tokenize", '{"prompt": "\\udfff"}', "prompt"),
    "NaN tokens": ("/v1/completions", '{"prompt": "Hi", "max_tokens": NaN}', "max_tokens"),
    "Infinity completions": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "n": Infinity}', "n"),
    "NaN log-probabilities": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "logprobs": NaN}', "logprobs"),
    "-Infinity top log-probabilities": ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], '
                                        '"logprobs": true, "top_logprobs": -Infinity}', "top_logprobs"),
    "an integer past float's range": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "temperature": 1' + "0" * 400
                                      + "}", "temperature"),
    "a body nested 100,000 deep": ("/v1/completions", '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", None),
    "a JSON schema nested 2,000 deep": ("/v1/completions", json.dumps(
        {"prompt": "Hi", "max_tokens": 2, "structured_outputs": {"json": DEEP_SCHEMA}}), "structured_outputs"),
}


@pytest.fixture
def quiet_server(caplog, capfd):
    """Yields a check that nothing was logged at ERROR or above, nor a traceback written."""
    caplog.set_level(logging.WARNING)

    def check():
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, [(r.name, r.getMessage()[:120]) for r in errors]
        assert "Traceback" not in capfd.readouterr().err

    yield check


@pytest.mark.parametrize("case", API)
def test_the_api_refuses_each_in_one_line_naming_the_field(page, quiet_server, case):
    path, body, field = API[case]
    r = httpx.post(page.url + path, content=body.encode(), headers={"content-type": "application/json"}, timeout=60)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    error = r.json()["error"]
    assert error["param"] == field and "\n" not in error["message"] and len(error["message"]) < 400, error
    quiet_server()


def join(page, body: bytes) -> httpx.Response:
    return httpx.post(page.url + "/gradio_api/queue/join", content=body,
                      headers={"content-type": "application/json"}, timeout=60)


def fn(page, name: str) -> int:
    return next(i for i, f in page.demo.fns.items() if f.api_name == name)


def test_the_page_refuses_an_event_it_does_not_have(page, quiet_server):
    for index in (9999, -1):
        r = join(page, json.dumps({"data": [], "fn_index": index, "session_hash": "x9"}).encode())
        assert r.status_code == 400 and r.json()["detail"] == f"This page has no event {index} (fn_index).", r.text
    r = httpx.post(page.url + "/gradio_api/run/predict", json={"data": [], "fn_index": 9999, "session_hash": "x9"},
                   timeout=60)
    assert r.status_code == 400
    quiet_server()


def test_the_page_refuses_a_lone_surrogate_naming_the_control(page, quiet_server):
    data = json.dumps(Controls(prompt="PROMPT", stop="STOP").values())
    for name, text in (("prompt", "PROMPT"), ("stop", "STOP")):
        body = '{"data": ' + data.replace(f'"{text}"', '"a \\ud800 b"') + f', "fn_index": {fn(page, "generate")}, ' \
               '"session_hash": "sur1"}'
        r = join(page, body.encode())
        detail = r.json()["detail"]
        assert r.status_code == 400 and f"({name}) holds a lone surrogate" in detail and "\n" not in detail, r.text
    quiet_server()


def test_the_page_refuses_a_body_nested_100000_deep(page, quiet_server):
    r = join(page, b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b', "fn_index": 0, "session_hash": "deep"}')
    assert r.status_code == 400 and "nests too deep" in r.json()["detail"]
    quiet_server()


def events_of(page, session: str) -> list[dict]:
    """The session's messages until its event completes."""
    out = []
    with httpx.stream("GET", page.url + "/gradio_api/queue/data", params={"session_hash": session}, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if out[-1].get("msg") in ("process_completed", "close_stream", "unexpected_error"):
                    break
    return out


@pytest.mark.parametrize("name", ["max_new_tokens", "top_k", "num_beams", "temperature"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_page_run_with_a_number_that_is_not_one_ends_in_one_line(page, quiet_server, name, value):
    c = Controls(prompt="The quick", **{"max_new_tokens": 3, name: 12345})
    data = json.dumps(c.values()).replace("12345", value, 1)
    session = f"nan-{name}-{value}"
    body = f'{{"data": {data}, "fn_index": {fn(page, "generate")}, "session_hash": "{session}"}}'
    assert join(page, body.encode()).status_code == 200
    done = [m for m in events_of(page, session) if m.get("msg") == "process_completed"]
    assert done and done[-1]["success"] is False
    said = done[-1]["output"]["error"]
    assert "\n" not in said and ("finite" in said or "must be" in said), said
    quiet_server()


def test_the_page_handlers_take_numbers_past_their_range_in_one_line(page):
    h = page.handlers
    rec = list(h.run.generate(*Controls(prompt="The quick", max_new_tokens=3, seed="1").values(),
                              SimpleNamespace(session_hash="big")))[-1]["record"]
    for layer, head in ((math.inf, 0), (0, math.inf), (math.nan, -math.inf)):
        out = h.inside.inspect_step(rec, 0, layer, head, None)
        assert "\n" not in out["stages_md"].strip().splitlines()[0]
    import gradio as gr
    with pytest.raises(gr.Error, match="step must be from 0 to 2"):
        list(h.branches.branch_run(rec, 10 ** 400, 5, SimpleNamespace(session_hash="big")))


def test_a_stream_of_a_session_that_never_joined_is_a_404_not_a_logged_error(page, quiet_server):
    r = httpx.get(page.url + "/gradio_api/queue/data", params={"session_hash": "never-joined"}, timeout=60)
    assert r.status_code == 404
    quiet_server()
