"""Every door prepares a run through one function (inference.request.prepare_run): the same bad
request gets the same refusal from the page, its /generate endpoint (gradio_client), the OpenAI
API and the CLI; the branch-with-a-constraint reproduction is refused in one line by each door
that has branches, and a plain run of another visitor right after it completes."""

from __future__ import annotations

import json

import httpx
import pytest

from page_api import call, output
from ui.controls import Controls

gradio_client = pytest.importorskip("gradio_client")

PROMPT = "The capital of France is"
SCHEMA = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'


def page_refusal(handlers, **kw) -> str:
    """begin's status line for the controls (what the page's button says), "" if it started."""
    c = Controls(**{"prompt": PROMPT, "max_new_tokens": 6, "seed": "3", "temperature": 0, **kw})
    status = handlers.run.begin(*c.values(), None).get("status", "")
    return status.removeprefix("⚠ Not started: ") if status.startswith("⚠ Not started") else ""


def generate(url, **kw):
    """/generate through gradio_client (a script's door to the page)."""
    client = gradio_client.Client(url, verbose=False)
    return client.predict(*call(**kw), api_name="/generate")


def endpoint_refusal(url, **kw) -> str:
    """/generate's error, "" if it ran."""
    try:
        generate(url, **{"prompt": PROMPT, "max_new_tokens": 6, "seed": "3", "temperature": 0, **kw})
    except Exception as e:  # noqa: BLE001 - gradio_client's AppError carries the server's message
        return str(e)
    return ""


def same(text: str) -> str:
    """A refusal as every door words it: each calls the field at fault by its own name for it (the
    page by its label, the CLI by its flag, the API by its key), the rest is one text."""
    from inference.sampling.settings import CONSTRAINT_KINDS
    from ui.controls import LABELS
    names = {**{label: name for name, label in LABELS.items()},
             **{"--" + kind.replace("_", "-"): "constraint_text" for kind in CONSTRAINT_KINDS}}
    for label, name in names.items():
        if text.startswith(label + " ") or text.startswith(label + ":"):
            return name + text[len(label):]
        if text.startswith(name + " "):
            return text
    return text


def api_refusal(url, **body) -> str:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, **body},
                   timeout=60)
    return r.json()["error"]["message"] if r.status_code >= 400 else ""


def cli_refusal(capsys, model_dir, *flags) -> tuple[int, str]:
    from inference.cli import main
    code = main(["generate", "--model", str(model_dir), "--device", "cpu", "--prompt", PROMPT,
                 "--max-new-tokens", "6", "--temperature", "0", *flags])
    err = capsys.readouterr().err.strip()
    return code, err.removeprefix("error: ")


# (the page's controls, the API body's fields, the CLI's flags): one bad request each.
BAD = {
    "temperature above its range": ({"temperature": 5}, {"temperature": 5}, ["--temperature", "5"]),
    "a logit bias beyond the vocabulary": ({"logit_bias": "999:1"}, {"logit_bias": {"999": 1}},
                                           ["--logit-bias", "999:1"]),
    "an invalid regular expression": ({"constraint": "regex", "constraint_text": "(["},
                                      {"structured_outputs": {"regex": "(["}}, ["--regex", "(["]),
    # Issue 59, finding 2: 0 or subnormal in float32, the stages' type (before: HTTP 500, exit 1).
    "a temperature float32 holds as a subnormal": ({"temperature": 1e-39}, {"temperature": 1e-39},
                                                   ["--temperature", "1e-39"]),
    "a top-p float32 holds as 0": ({"top_p": 1e-300}, {"top_p": 1e-300}, ["--top-p", "1e-300"]),
    "a repetition penalty float32 holds as 0": ({"repetition_penalty": 1e-300}, {"repetition_penalty": 1e-300},
                                                ["--repetition-penalty", "1e-300"]),
}


@pytest.mark.parametrize("case", BAD)
def test_the_same_bad_request_gets_the_same_refusal_at_every_door(case, live_app, tiny_dirs, capsys):
    url, engine, handlers = live_app
    page, body, flags = BAD[case]
    said = {"page": page_refusal(handlers, **page), "endpoint": endpoint_refusal(url, **page),
            "api": api_refusal(url, **body)}
    code, said["cli"] = cli_refusal(capsys, tiny_dirs["gqa_tied"], *flags)
    assert code == 2
    assert said["api"] and all("\n" not in text for text in said.values()), said
    assert len({same(text) for text in said.values()}) == 1, said
    assert engine.active_runs == 0


def test_a_branch_the_json_schema_forbids_is_refused_by_every_door_and_the_next_run_completes(
        live_app, tiny_dirs, capsys):
    """The reproduction: a run's candidate "," clicked as a branch, then a JSON schema. Each door
    refuses in one line before the run is queued; another visitor's plain run completes."""
    url, engine, handlers = live_app
    comma = engine.tokenizer.encode_continuation(",")
    prefix = ",".join(map(str, comma))
    kw = {"prefix_ids": prefix, "constraint": "json_schema", "constraint_text": SCHEMA}
    expected = "does not allow the given tokens: token 0 of them"
    assert expected in page_refusal(handlers, **kw)
    assert expected in endpoint_refusal(url, **kw)
    (tmp := tiny_dirs["gqa_tied"].parent / "person.json").write_text(SCHEMA)
    code, err = cli_refusal(capsys, tiny_dirs["gqa_tied"], "--prefix-ids", prefix, "--json-schema", str(tmp))
    assert code == 2 and expected in err and "\n" not in err
    assert engine.active_runs == 0 and engine.down is None
    result = generate(url, prompt="Once upon a time", max_new_tokens=5, seed="1")
    assert output(result, "api_tokens") and "Run ended" in output(result, "status")


def test_the_api_takes_a_constraint_as_its_clients_send_one(live_app):
    """vLLM's structured_outputs on completions; on chat also OpenAI's response_format. The text
    each run makes is what the constraint allows."""
    url, engine, _ = live_app
    r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                                  "structured_outputs": {"regex": "[0-9]{3}"}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].isdigit() and len(r.json()["choices"][0]["text"]) == 3
    for fmt in ({"type": "json_schema", "json_schema": {"name": "p", "schema": json.loads(SCHEMA)}},
                {"type": "json_object"}):
        r = httpx.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Name someone."}], "max_tokens": 40, "seed": 1,
            "response_format": fmt}, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":  # the constraint completed: the text is its JSON
            assert isinstance(json.loads(choice["message"]["content"]), dict)
    r = httpx.post(f"{url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "structured_outputs": "json_schema"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"


@pytest.mark.parametrize("endpoint, body", [
    ("completions", {"prompt": PROMPT, "n": 2}),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 2}),
])
def test_the_api_prepares_every_run_before_it_runs_any(live_app, monkeypatch, endpoint, body):
    """The API prepares each completion by prepare_run before it starts any: the engine refusing
    the second one (its check_run) is the request's 400, even for a stream, and no run of it
    reached the engine; the visitor's share is given back and the next request runs."""
    from inference.errors import InputError
    url, engine, handlers = live_app
    checked, ran = [], []
    check, run = engine.check_run, engine.run

    def refuse_the_second(request):
        checked.append(request)
        if len(checked) == 2:
            raise InputError("temperature is not for this engine", field="temperature")
        return check(request)

    def recorded(request, cancel=None):
        ran.append(request)
        return run(request, cancel)
    monkeypatch.setattr(engine, "check_run", refuse_the_second)
    monkeypatch.setattr(engine, "run", recorded)
    r = httpx.post(f"{url}/v1/{endpoint}", json={**body, "max_tokens": 4, "stream": True}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {"message": "temperature is not for this engine", "type": "invalid_request_error",
                                 "param": "temperature", "code": None}
    assert len(checked) == 2 and ran == []
    assert len(handlers.page.registry) == 0
    monkeypatch.undo()
    ok = httpx.post(f"{url}/v1/{endpoint}", json={**body, "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200, ok.text
