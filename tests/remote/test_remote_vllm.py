"""The page and the CLI in front of a real vLLM server, serving the default model.

Skipped unless TOKENLAB_VLLM_URL names a running server (http://127.0.0.1:PORT/v1):
`bash scripts/test_vllm.sh` installs vLLM's CPU build in its own venv, starts the server on the
default model and runs these tests. What we show is checked against what vLLM itself answers to
its own API, asked here with urllib (not through our client), and against our local engine.
"""

import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest

URL = os.environ.get("TOKENLAB_VLLM_URL", "").rstrip("/")
if not URL:
    pytest.skip("no vLLM server: set TOKENLAB_VLLM_URL=http://127.0.0.1:PORT/v1 "
                "(bash scripts/test_vllm.sh starts one and runs these tests)", allow_module_level=True)

from inference.cli import main  # noqa: E402
from inference.errors import ContextTooLong, ModelNotServed, ServerRefused  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from ui.controls import Controls  # noqa: E402
from ui.handlers import Handlers  # noqa: E402
from page_api import call, output  # noqa: E402

ROOT_URL = URL[:-3] if URL.endswith("/v1") else URL
PROMPT = "The capital of France is"
CHAT = "Explain in one sentence why the sky is blue."
N = 24  # tokens per greedy run
TOP = 10


def vllm(path: str, body: dict | None = None, root: bool = False) -> dict:
    """vLLM's own answer to its own API."""
    req = urllib.request.Request((ROOT_URL if root else URL) + path,
                                 None if body is None else json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def metric(name: str) -> float:
    with urllib.request.urlopen(ROOT_URL + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values = [float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    assert values, f"{name} not in the server's /metrics"
    return sum(values)


@pytest.fixture(scope="module")
def engine():
    from inference.remote.engine import RemoteEngine
    return RemoteEngine.connect(URL)


@pytest.fixture(scope="module")
def model(engine) -> str:
    return engine.name


@pytest.fixture(scope="module")
def handlers(engine):
    return Handlers(engine, top_n=TOP)


@pytest.fixture(scope="module")
def local():
    """Our own engine on the same weights, in float32 as the server runs them."""
    from inference.serving.engine import Engine
    return Engine.load(None, device="cpu", dtype="float32", decode_dtype="same")


def page_run(h, session="s", **kw) -> dict:
    """The run's last update, keyed by component name."""
    c = Controls(**{"prompt": PROMPT, "temperature": 0.0, "max_new_tokens": N, "seed": "7", **kw})
    updates = list(h.run.generate(*c.values(), SimpleNamespace(session_hash=session)))
    return updates[-1]


def test_the_server_is_described(engine):
    info = engine.describe()
    assert info.capabilities.logprobs == "raw" and info.logprobs_source == "probed at start"  # vLLM's default mode
    assert info.max_seq_len == 2048  # the server's --max-model-len, not the config's 8192
    # The server loaded the model from a path on this machine: its config.json is read there.
    assert info.cfg is not None and info.cfg.n_layers == 30 and info.cfg.n_kv_heads == 3
    assert info.kv_value_bytes == 4  # --dtype float32, found from the server's KV-cache pool


@pytest.mark.parametrize("mode, prompt", [("completion", PROMPT), ("chat", CHAT)])
def test_greedy_text_on_the_page_is_vllms_own(handlers, model, mode, prompt):
    if mode == "chat":
        answer = vllm("/chat/completions", {"model": model, "messages": [{"role": "user", "content": prompt}],
                                            "temperature": 0, "max_tokens": N})
        expected = answer["choices"][0]["message"]["content"]
    else:
        answer = vllm("/completions", {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": N})
        expected = answer["choices"][0]["text"]
    last = page_run(handlers, prompt=prompt, mode=mode)
    rec, tokens, stats, kv_text = (last[n] for n in ("record", "api_tokens", "stats", "kv_text"))
    assert rec.done.text == expected and "".join(t["token"] for t in tokens) == expected
    assert rec.done.reason == ("length" if answer["choices"][0]["finish_reason"] == "length" else "eos")
    assert rec.done.generated_tokens == answer["usage"]["completion_tokens"]
    assert "at the page" in stats and "by the formula" in kv_text


def test_greedy_text_in_the_cli_is_vllms_own(model, capsys):
    expected = vllm("/completions", {"model": model, "prompt": PROMPT, "temperature": 0,
                                     "max_tokens": N})["choices"][0]["text"]
    assert main(["generate", "--engine-url", URL, "--prompt", PROMPT, "--temperature", "0",
                 "--max-new-tokens", str(N)]) == 0
    assert capsys.readouterr().out == expected + "\n"
    assert main(["generate", "--engine-url", URL, "--prompt", PROMPT, "--temperature", "0",
                 "--max-new-tokens", str(N), "--top", "3", "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    steps, done = lines[:-1], lines[-1]
    assert done["text"] == expected == "".join(s["text"] for s in steps) + done["tail"]
    for s in steps:  # what vLLM cannot give is null, and each key is there
        assert s["entropy"] is None and s["kv_cache_bytes"] is None and s["kv_cache_capacity_bytes"] is None
        assert s["prob"] == 1.0 and 0 < s["raw_prob"] <= 1 and s["rank"] >= 1  # greedy
        assert len(s["top"]) == 3


def test_bars_show_the_servers_log_probabilities(handlers, model):
    """Each step's candidates are vLLM's own top-10 log-probabilities for the same request."""
    rec = page_run(handlers)["record"]
    ids = rec.prompt_ids
    answer = vllm("/completions", {"model": model, "prompt": ids, "temperature": 0, "max_tokens": N,
                                   "logprobs": TOP, "return_tokens_as_token_ids": True})
    theirs = answer["choices"][0]["logprobs"]
    assert [int(t.split(":")[1]) for t in theirs["tokens"]] == [s.token_id for s in rec.steps]
    worst = 0.0
    for step, top in zip(rec.steps, theirs["top_logprobs"]):
        expected = {int(k.split(":")[1]): math.exp(v) for k, v in top.items()}
        assert {c.id for c in step.top} == set(expected)
        for c in step.top:
            worst = max(worst, abs(c.raw_prob - expected[c.id]))
        bars = handlers.run.select_step(rec, step.step)
        shown = re.findall(r"<span class='tl-p'>([^<]*)</span>", bars)[2::2]  # each candidate's raw p
        assert [float(x) for x in shown] == pytest.approx([expected[c.id] for c in step.top], abs=5e-5, rel=5e-3)
        assert "raw model <span class='tl-p-word'>probability<" in bars and "From the server&#x27;s log-probabilities" in bars
    # Two requests for the same tokens: the same numbers, but for float rounding in the batch.
    assert worst < 1e-4, worst


def test_probabilities_agree_with_our_engine(engine, local):
    """The first step's top-10 raw probabilities and a teacher-forced score, vLLM against ours."""
    ids = engine.prompt_ids(PROMPT)
    assert ids == local.prompt_ids(PROMPT)
    first = next(engine.generate_ids(ids, SamplingParams(temperature=0, max_new_tokens=1), TOP))
    ours = next(local.generate_ids(ids, SamplingParams(temperature=0, max_new_tokens=1), TOP))
    theirs = {c.id: c.raw_prob for c in first.top}
    assert first.token_id == ours.token_id == local.tokenizer.encode_continuation(" Paris")[0]
    diff = max(abs(theirs[c.id] - c.raw_prob) for c in ours.top if c.id in theirs)
    assert abs(first.raw_prob - 0.7725) < 1e-3 and diff < 2e-3, diff
    remote_score = engine.score(ids, " Paris, of course.")
    local_score = local.score(ids, " Paris, of course.")
    assert [i for i, _, _ in remote_score] == [i for i, _, _ in local_score]
    assert max(abs(a[2] - b[2]) for a, b in zip(remote_score, local_score)) < 2e-3


def test_how_likely_uses_the_servers_prompt_logprobs(handlers, engine, model):
    rec = page_run(handlers, max_new_tokens=2)["record"]
    table = handlers.experiments.likelihood(rec, 0, " Paris")
    answer = vllm("/completions", {"model": model, "prompt": rec.prompt_ids + [7042], "max_tokens": 1,
                                   "prompt_logprobs": 0})
    expected = answer["choices"][0]["prompt_logprobs"][-1]["7042"]["logprob"]
    assert f"| {math.exp(expected):.4g} | {expected:.3f} |" in table


def test_the_whole_servers_load_is_shown(handlers):
    text = handlers.run.server_load()
    assert "whole server" in text and "% in use of" in text and "requests running" in text


@pytest.mark.parametrize("how", ["stop", "closed tab"])
def test_stop_cancels_the_request_on_the_server(handlers, engine, how):
    """Stop (and a closed tab, which closes the page's generator) closes the stream after the
    first event, and the server stops generating: far fewer tokens than asked for."""
    before = metric("vllm:generation_tokens_total")
    c = Controls(prompt="Once upon a time", temperature=1.0, max_new_tokens=2000, seed="1")
    gen = handlers.run.generate(*c.values(), SimpleNamespace(session_hash="stop-" + how))
    rec = next(gen)["record"]  # the empty first update
    while not rec.steps:  # updates come every interval, with or without tokens: until the first
        rec = next(gen)["record"]
    if how == "stop":
        handlers.run.stop(SimpleNamespace(session_hash="stop-" + how))
        rest = list(gen)
        assert rest[-1]["record"].done.reason == "cancelled"
    else:
        gen.close()
    assert engine.active_runs == 0
    deadline = time.monotonic() + 120  # the server notices the closed connection on its own time
    while metric("vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric("vllm:num_requests_running") == 0
    assert metric("vllm:generation_tokens_total") - before < 2000


def test_the_servers_refusals_are_one_line(engine, handlers, capsys):
    from inference.remote.engine import RemoteEngine
    with pytest.raises(ModelNotServed, match="does not serve 'nope'"):
        RemoteEngine.connect(URL, model="nope", logprobs="raw")
    assert main(["generate", "--engine-url", URL, "--prompt", "hi", "--top", "30"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the model server refused the request (HTTP 400): Requested sample "
                          "logprobs of 30") and err.count("\n") == 1
    # A page that believes the context is longer than the server's: vLLM's own message.
    wrong = replace(engine.describe(), max_seq_len=4096)
    confused = RemoteEngine(engine.http, engine.name, 4096, "raw", "given")
    confused.info = wrong
    with pytest.raises(ContextTooLong, match="maximum context length is 2048"):
        list(confused.generate_ids([504] * 2100, SamplingParams(max_new_tokens=4), 1))
    with pytest.raises(gr.Error) as e:
        list(Handlers(engine, top_n=30).run.generate(*Controls(prompt="hi").values(), None))
    assert "max allowed: 20" in str(e.value) and "\n" not in str(e.value)


def test_what_needs_the_models_insides_says_so(handlers):
    rec = page_run(handlers, max_new_tokens=2)["record"]
    for panel in (handlers.inside.inspect_step(rec, 0, 0)["stages_md"], handlers.experiments.replay_step(rec, 0, 1.0, 0, 1.0, 0.0, 1.0)["replay_md"]):
        assert panel.startswith("⚠") and "not available when the page is in front of a server" in panel


def test_the_page_over_its_api(engine, model):
    from gradio_client import Client
    from app import serve
    from ui.layout import build_ui

    expected = vllm("/completions", {"model": model, "prompt": PROMPT, "temperature": 0,
                                     "max_tokens": N})["choices"][0]["text"]
    demo = build_ui(engine)
    _, url, _ = serve(demo, engine, block=False)
    try:
        result = Client(url, verbose=False).predict(*call(prompt=PROMPT, max_new_tokens=N, seed="1"),
                                                    api_name="/generate")
    finally:
        demo.close()
    assert "".join(t["token"] for t in output(result, "api_tokens")) == expected
    assert "From the server&#x27;s log-probabilities" in output(result, "bars")


def test_the_benchmark_measures_the_server_on_the_same_prompt_ids(local):
    """bench.run --vllm-url: vLLM side by side with the engine; every token of the run timed."""
    from bench.run import measure_vllm
    result = measure_vllm(URL, None, local, 12, TOP)
    assert result["decode_tok_s"] > 0 and result["ttft_128_ms"] > 0 and result["ttft_512_ms"] > 0
    assert result["p95_ms"] >= result["p50_ms"] > 0


def test_a_run_of_given_tokens_is_refused_by_a_server(engine):
    """A server draws its own tokens: a beam opened as a run needs a local model."""
    from inference.errors import InputError
    from inference.request import prepare_run
    with pytest.raises(InputError, match="needs a local model"):
        prepare_run(engine, {"temperature": 1.0}, prompt=PROMPT, forced=[5, 6])
