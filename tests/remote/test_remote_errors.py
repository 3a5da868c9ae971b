"""In front of a server: what a user sees when the server is down, hangs, refuses or breaks off.
Each is one line (a TokenLabError), on the page and in the CLI. The server here is the small
fake of fake_server.py, for the cases vLLM cannot be made to produce; what vLLM itself returns
is tested against vLLM in test_remote_vllm.py."""

import json
import socket
from types import SimpleNamespace

import gradio as gr
import pytest

from bench.page_client import free_port
from fake_server import MODELS, FakeServer, chunk
from inference.cli import main
from inference.errors import (ContextTooLong, InputError, ModelNotServed, ServerError,
                              ServerRefused, ServerTimeout, ServerUnreachable)
from inference.remote.engine import RemoteEngine
from inference.sampling.params import SamplingParams

# The client's timeout: generous while the fake answers (a busy machine may answer slowly), and
# TIMEOUT_S only for the exchange in which it never answers, whatever the speed.
ANSWERS_S, TIMEOUT_S = 60.0, 0.5


def tokenizing(routes: dict) -> dict:
    """The routes of a server that tokenizes: one id per character."""
    return {"/v1/models": (200, MODELS),
            "/tokenize": lambda h, body: h.send_json(200, {"tokens": [ord(c) for c in body["prompt"]],
                                                           "count": len(body["prompt"]), "max_model_len": 64}),
            "/detokenize": lambda h, body: h.send_json(200, {"prompt": "".join(map(chr, body["tokens"]))}),
            **routes}


def engine(server: FakeServer) -> RemoteEngine:
    return RemoteEngine.connect(server.url, logprobs="raw", timeout_s=ANSWERS_S)


def sockets(monkeypatch) -> list:
    """The sockets the client connects from now on, newest last."""
    made, create = [], socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: made.append(create(*a, **k)) or made[-1])
    return made


def silence_times_out(e: RemoteEngine, open_sockets=()) -> None:
    """From here on the client gives up after TIMEOUT_S of silence: on requests it makes from
    now, and on the sockets given (a stream already open)."""
    e.http.timeout_s = TIMEOUT_S
    for sock in open_sockets:
        if sock.fileno() >= 0:  # still open
            sock.settimeout(TIMEOUT_S)


def run(e: RemoteEngine) -> list:
    return list(e.generate_ids([104, 105], SamplingParams(temperature=0, max_new_tokens=4), top_n=1))


def test_down_server_is_one_line_in_the_cli(capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["generate", "--engine-url", url, "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the model server at " + url) and "refused" in err
    assert err.count("\n") == 1
    with pytest.raises(ServerUnreachable):
        RemoteEngine.connect(url)


def test_unknown_host_is_one_line(monkeypatch):
    def no_such_host(*args, **kwargs):  # no lookup leaves the machine
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(ServerUnreachable, match="unknown host"):
        RemoteEngine.connect("http://model-server:8000/v1", logprobs="raw")


@pytest.mark.parametrize("url", ["ftp://x/v1", "127.0.0.1:8000", "http://h:notaport/v1"])
def test_bad_url_is_an_input_error(url, capsys):
    assert main(["tokenize", "--engine-url", url, "--text", "x"]) == 2
    assert "--engine-url" in capsys.readouterr().err


def test_remote_flags_without_a_url_and_local_flags_with_one(capsys):
    assert main(["tokenize", "--engine-model", "m", "--text", "x"]) == 2
    assert "only apply with --engine-url" in capsys.readouterr().err
    assert main(["tokenize", "--engine-url", "http://127.0.0.1:1/v1", "--model", "m", "--text", "x"]) == 2
    assert "local engine" in capsys.readouterr().err


def test_a_server_that_does_not_answer_times_out():
    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": lambda h, body: server.release.wait(30)}))
        e = engine(server)
        silence_times_out(e)
        with pytest.raises(ServerTimeout, match=f"did not answer within {TIMEOUT_S:g} s"):
            run(e)
        assert e.active_runs == 0


def test_a_stream_that_stalls_times_out_after_its_tokens(monkeypatch):
    def one_then_hang(h, body):
        h.start_stream()
        h.event(chunk(120, "x"))
        server.release.wait(30)

    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": one_then_hang}))
        e = engine(server)
        opened = sockets(monkeypatch)
        events = e.generate_ids([104], SamplingParams(temperature=0, max_new_tokens=4), top_n=1)
        assert next(events).token_id == 120  # the token that came is delivered first
        silence_times_out(e, opened)
        with pytest.raises(ServerTimeout, match="sent nothing for 0.5 s in the middle"):
            next(events)


def test_a_refusal_carries_the_servers_message_on_the_page():
    from ui.controls import Controls
    from ui.handlers import Handlers

    refusal = {"error": {"message": "The server is overloaded,\n try later", "type": "ServiceUnavailable",
                         "code": 503}}
    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": (503, refusal)}))
        e = engine(server)
        with pytest.raises(ServerRefused, match=r"refused the request \(HTTP 503\): The server is overloaded, try later"):
            run(e)
        h = Handlers(e)
        with pytest.raises(gr.Error) as err:
            list(h.run.generate(*Controls(prompt="hi", max_new_tokens=4).values(), SimpleNamespace(session_hash="s")))
        assert "HTTP 503" in str(err.value) and "\n" not in str(err.value)
        assert len(h.page.registry) == 0 and e.active_runs == 0


def test_a_stream_cut_off_says_so():
    def one_then_close(h, body):
        h.start_stream()
        h.event(chunk(120, "x"))
        h.close_connection = True  # no [DONE]: the connection just ends

    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": one_then_close}))
        with pytest.raises(ServerUnreachable, match="closed the connection before the end"):
            run(engine(server))


def test_an_error_inside_the_stream_is_a_refusal():
    def error_event(h, body):
        h.start_stream()
        h.event({"error": {"message": "engine dead", "code": 500}})

    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": error_event}))
        with pytest.raises(ServerRefused, match="engine dead"):
            run(engine(server))


@pytest.mark.parametrize("status, message, error", [
    (404, "The model `x` does not exist.", ModelNotServed),
    (400, "This model's maximum context length is 64 tokens. However, you requested 70 tokens.", ContextTooLong),
])
def test_refusals_are_named(status, message, error):
    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": (status, {"error": {"message": message, "code": status}})}))
        with pytest.raises(error, match="maximum context length" if error is ContextTooLong else "does not exist"):
            run(engine(server))
    assert issubclass(ContextTooLong, InputError)  # the CLI exits 2 for it, as for a local one


def test_wrong_base_path_and_answers_that_are_not_json():
    with FakeServer({"/v1/models": (200, b"<html>hello</html>")}) as server:
        with pytest.raises(ServerError, match="not JSON"):
            RemoteEngine.connect(server.url, logprobs="raw")
        with pytest.raises(ServerRefused, match="is --engine-url the server's OpenAI API base"):
            RemoteEngine.connect(server.url[:-3] + "/api", logprobs="raw")


def test_several_models_need_a_name_and_a_wrong_name_lists_them():
    two = {"data": [{"id": "a", "max_model_len": 64}, {"id": "b", "max_model_len": 64}]}
    with FakeServer({"/v1/models": (200, two)}) as server:
        with pytest.raises(InputError, match="serves 2 models .*--engine-model"):
            RemoteEngine.connect(server.url, logprobs="raw")
        with pytest.raises(ModelNotServed, match="does not serve 'c'; it serves 'a', 'b'"):
            RemoteEngine.connect(server.url, model="c", logprobs="raw")
        assert RemoteEngine.connect(server.url, model="b", logprobs="raw").name == "b"


@pytest.mark.parametrize("top, expected", [
    ({"token_id:5": -0.7, "token_id:6": -1.2}, "raw"),
    ({"token_id:5": 0.0, "token_id:6": -9999.0}, "processed"),
    ({"token_id:5": 14.2, "token_id:6": 12.0}, "raw logits"),
    ({"token_id:5": 14.2, "token_id:6": -9999.0}, "processed logits"),
])
def test_which_distribution_the_server_returns_is_probed(top, expected):
    answer = {"choices": [{"text": "x", "logprobs": {"top_logprobs": [top]}}]}
    with FakeServer({"/v1/models": (200, MODELS), "/v1/completions": (200, answer)}) as server:
        if expected in ("raw", "processed"):
            assert RemoteEngine.connect(server.url).describe().capabilities.logprobs == expected
        else:
            with pytest.raises(ServerError, match=f"returns {expected}, not log-probabilities"):
                RemoteEngine.connect(server.url)
        probe = next(body for path, body in server.requests if path == "/v1/completions")
        assert probe["top_k"] == 1 and probe["logprobs"] == 2


def test_metrics_that_do_not_answer_are_said_on_the_page():
    from ui.handlers import Handlers

    with FakeServer(tokenizing({})) as server:
        text = Handlers(engine(server)).run.server_load()
    assert "/metrics did not answer" in text and "\n" not in text


def test_jsonl_keeps_its_keys_and_writes_null(capsys):
    """A field the server cannot give is null in the CLI's JSONL, never left out or made up."""
    def stream(h, body):
        h.start_stream()
        h.event(chunk(120, "x", -0.25))
        h.event(chunk(121, "y", -0.5, finish="length"))
        h.wfile.write(b"data: [DONE]\n\n")

    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": stream}))
        assert main(["generate", "--engine-url", server.url, "--engine-logprobs", "raw", "--prompt", "hi",
                     "--max-new-tokens", "2", "--temperature", "0.5", "--top", "1", "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first, done = lines[0], lines[-1]
    assert {"entropy", "kv_cache_bytes", "kv_cache_capacity_bytes", "rank", "prob", "raw_prob"} <= set(first)
    assert first["entropy"] is None and first["kv_cache_bytes"] is None
    assert first["prob"] is None  # temperature 0.5 and raw log-probabilities: not the sampled distribution
    assert first["raw_prob"] == pytest.approx(0.7788007830714049)
    assert first["top"] == [{"id": 120, "piece": "x", "prob": None, "raw_prob": first["raw_prob"], "forbidden": False, "removed_by": None}]
    assert done["text"] == "xy" and done["reason"] == "length" and done["generated_tokens"] == 2


def test_a_constraint_goes_as_vllms_structured_outputs_and_its_masked_mass_is_unknown():
    """vLLM 0.32 takes {"structured_outputs": {"json": schema}} (guided_json went in 0.12); the
    server reports no masked mass, so each step says None, and the capabilities say so first."""
    sent = []

    def completions(h, body):
        sent.append(body)
        h.start_stream()
        h.event(chunk(123, "{"))
        h.event(chunk(125, "}", finish="stop"))
        h.wfile.write(b"data: [DONE]\n\n")

    with FakeServer({}) as server:
        server.routes.update(tokenizing({"/v1/completions": completions}))
        e = engine(server)
        assert e.info.capabilities.masked_mass is False
        assert {"constraint", "constraint_text"} <= e.info.capabilities.settings
        params = SamplingParams(temperature=1.0, max_new_tokens=4, constraint="json_schema",
                                constraint_text='{"type": "object"}')
        events = list(e.generate_ids([104, 105], params, top_n=1))
        e.close()
    assert sent[0]["structured_outputs"] == {"json": {"type": "object"}}
    assert not any(k.startswith("guided_") for k in sent[0])
    assert [ev.masked_mass for ev in events[:-1]] == [None, None] and events[-1].text == "{}"
    assert all(c.forbidden is None for ev in events[:-1] for c in ev.top)  # not known either


def test_a_setting_a_server_cannot_run_is_a_bad_argument_in_the_cli(capsys):
    """--top-n-sigma in front of a server: refused in one line before any request, exit 2 as
    for every bad argument (1 is for a server that fails)."""
    with FakeServer({}) as server:
        server.routes.update(tokenizing({}))
        assert main(["generate", "--engine-url", server.url, "--engine-logprobs", "raw", "--prompt", "hi",
                     "--top-n-sigma", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: top-n") and "--top-n-sigma" in err and err.count("\n") == 1
        assert not any(path == "/v1/completions" for path, _ in server.requests)
