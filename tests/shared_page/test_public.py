"""A public link: the page serves only its own routes, and one visitor's share is bounded (one
job per session, runs and sessions per client, a cap on new tokens), said on the page."""

import os
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import gradio as gr
import httpx
import pytest

from engine_hold import wait_until
from helpers import files_under
from page_api import call, output
from ui.controls import Controls
from ui.handlers import Handlers
from server.admission import UNREAD_REFUSALS
from server.guard import Sessions, served
from server.limits import RUN_GOING, Limits
from ui.controls import shaping_values  # noqa: E402

gradio_client = pytest.importorskip("gradio_client")

LIMITS = Limits(max_new_tokens=40, runs_per_client=1, sessions_per_client=3)



def req(session, host="198.51.100.1", user=None):
    return SimpleNamespace(session_hash=session, client=SimpleNamespace(host=host), username=user)


@pytest.fixture(scope="module")
def shared_app(tiny_dirs, tmp_path_factory):
    """The page with a shared page's limits, its temp directories empty and its own."""
    from inference.serving.engine import Engine
    from app import serve
    from ui.layout import build_ui

    tmp = tmp_path_factory.mktemp("public")
    gradio_tmp, py_tmp = tmp / "gradio", tmp / "py"
    py_tmp.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADIO_TEMP_DIR", str(gradio_tmp))
        mp.setattr(tempfile, "tempdir", str(py_tmp))
        engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"])
        handlers = Handlers(engine, limits=LIMITS)
        demo = build_ui(engine, handlers)
        app, url, _ = serve(demo, engine, block=False)
        yield SimpleNamespace(url=url.rstrip("/"), engine=engine, handlers=handlers, demo=demo, app=app,
                              temp_dirs=(gradio_tmp, py_tmp))
        demo.close()


# ------------------------------------------------------------------ routes


def test_only_the_pages_own_routes_are_served():
    for path in ("/", "/config", "/assets/index.js", "/theme.css", "/gradio_api/queue/join",
                 "/gradio_api/queue/data", "/gradio_api/heartbeat/abc", "/gradio_api/run/predict",
                 "/gradio_api/info", "/gradio_api/call/generate", "/gradio_api/call/generate/123",
                 "/gradio_api/cancel", "/gradio_api/startup-events", "/gradio_api/login_check"):
        assert served(path), path
    for path in ("/gradio_api/upload", "/gradio_api/upload_progress", "/gradio_api/file=/etc/passwd",
                 "/gradio_api/file/etc/passwd", "/gradio_api/proxy=https://x.hf.space/a",
                 "/gradio_api/process_recording", "/gradio_api/component_server",
                 "/gradio_api/stream/e1", "/gradio_api/stream/s/r/1/playlist.m3u8", "/gradio_api/vibe-code",
                 "/gradio_api/run-history/connect", "/gradio_api/runs", "/gradio_api/custom_component/a/b/c/d",
                 "/gradio_api/run/generate", "/gradio_api/api/generate", "/gradio_api/deep_link",
                 "/gradio_api/mcp/sse", "/gradio_api/dev/reload", "/gradio_api/queue/join/../../upload",
                 "/monitoring", "/monitoring/summary"):
        assert not served(path), path


def test_uploads_and_files_are_refused_and_nothing_is_written(shared_app, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for visitors")
    random_20mb = os.urandom(20 * 1024 * 1024)
    with httpx.Client(base_url=shared_app.url, timeout=60) as http:
        for files in ({"files": ("a.bin", random_20mb)}, {"files": ("a.txt", b"hello")}):
            r = http.post("/gradio_api/upload", files=files)
            assert r.status_code == 404 and r.json()["detail"] == "Not served by this page."
        assert http.post("/gradio_api/upload?upload_id=x", content=b"x").status_code == 404
        for path in (f"/gradio_api/file={secret}", f"/gradio_api/file/{secret}", "/gradio_api/file=https://example.com/",
                     "/gradio_api/proxy=https://example.hf.space/x", "/gradio_api/upload_progress?upload_id=x"):
            r = http.get(path)
            assert r.status_code == 404 and "not for visitors" not in r.text, path
        # The queued endpoints only through the queue, never the REST route that skips it.
        assert http.post("/gradio_api/run/generate", json={"data": call()}).status_code == 404
        assert http.get("/").status_code == 200 and http.get("/config").status_code == 200
    assert files_under(*shared_app.temp_dirs) == []


def test_an_oversized_body_is_refused_before_it_is_read(shared_app):
    """A request claiming 17 MiB gets 413 at once: the server answers before any body arrives."""
    host, port = shared_app.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 17825792\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):  # the server closes the connection after its answer
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "at most 16 MiB" in answer


# ------------------------------------------------------------------ one job per session


def test_a_second_job_in_a_session_is_refused_while_the_first_completes(tiny_engine, hold, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # the second run draws a random seed: it goes to its cap
    h = Handlers(tiny_engine)
    held = hold(tiny_engine)
    first = h.run.generate(*Controls(prompt="The quick", temperature=0.0, max_new_tokens=12).values(), req("tab"))
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(list, first)
        held.step(1)  # the run has made a token and is held before the next
        c = Controls(prompt="Another", max_new_tokens=5)
        for attempt in (lambda: list(h.run.generate(*c.values(), req("tab"))),
                        lambda: h.run.begin(*c.values(), req("tab")),
                        lambda: h.experiments.compare(*c.values(), *shaping_values(), "", req("tab"))):
            with pytest.raises(gr.Error) as e:
                attempt()
            assert e.value.message == RUN_GOING
        assert h.run.begin(*c.values(), req("other tab"))["prompt_view"]["value"] == "<s>Another"  # other sessions may
        held.open()
        rec = done.result(timeout=60)[-1]["record"]
    assert rec.done.reason == "length" and len(rec.steps) == 12  # the first ran to its end
    assert len(h.page.registry) == 0
    assert len(list(h.run.generate(*c.values(), req("tab")))[-1]["record"].steps) == 5  # and then the next


def test_generate_right_after_stop_waits_for_the_stopped_run(tiny_engine, hold, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # a random seed: still going when stopped
    h = Handlers(tiny_engine)
    held = hold(tiny_engine)
    gen = h.run.generate(*Controls(prompt="The quick", max_new_tokens=200).values(), req("tab"))
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(list, gen)
        held.step(1)
        h.run.stop(req("tab"))  # the held run ends within its step
        assert h.run.begin(*Controls(prompt="Next").values(), req("tab"))["prompt_view"]["value"] == "<s>Next"  # not refused
        assert done.result(timeout=60)[-1]["record"].done.reason == "cancelled"


def test_runs_per_client(tiny_engine, hold):
    h = Handlers(tiny_engine, limits=Limits(runs_per_client=1))
    held = hold(tiny_engine)
    c = Controls(prompt="The quick", temperature=0.0, max_new_tokens=6)
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(lambda: list(h.run.generate(*c.values(), req("a1", host="203.0.113.1"))))
        held.step(1)
        with pytest.raises(gr.Error, match="1 run going or waiting.*allows 1 at a time"):
            list(h.run.generate(*c.values(), req("a2", host="203.0.113.1")))  # same address, other tab
        with pytest.raises(gr.Error, match="allows 1 at a time"):
            h.run.begin(*c.values(), req("a3", host="203.0.113.1"))
        b = pool.submit(lambda: list(h.run.generate(*c.values(), req("b1", host="203.0.113.2"))))
        # With --auth a visitor is their login: the same address, another user, is another visitor.
        assert h.run.begin(*c.values(), req("u1", host="203.0.113.1", user="ann"))["prompt_view"]["value"] == "<s>The quick"
        held.open()
        assert len(a.result(60)[-1]["record"].steps) == len(b.result(60)[-1]["record"].steps) == 6


def test_the_new_tokens_cap_is_on_the_page_and_enforced(tiny_engine, monkeypatch):
    from ui.layout import build_ui
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # a random seed: the run goes to its cap
    h = Handlers(tiny_engine, limits=Limits(max_new_tokens=5))
    with pytest.raises(gr.Error, match=r"The server allows at most 5 new tokens; got 6\."):
        list(h.run.generate(*Controls(max_new_tokens=6).values(), req("t")))
    assert len(list(h.run.generate(*Controls(max_new_tokens=5).values(), req("t")))[-1]["record"].steps) == 5
    values = h.share.restore(SimpleNamespace(query_params={"max_new_tokens": "99"}))
    assert values["max_new_tokens"] == 5
    assert "lowered from 99 to 5: The server allows at most 5 new tokens" in values["notice"]
    config = build_ui(tiny_engine, h).get_config_file()
    slider = next(c for c in config["components"] if c["props"].get("elem_id") == "max-new-tokens")
    assert slider["props"]["maximum"] == 5 and "the server allows at most 5 new tokens" in slider["props"]["info"]
    limits_note = next(c for c in config["components"] if c["props"].get("elem_id") == "limits")
    assert "at most 5 new tokens a run" in limits_note["props"]["value"]
    plain = build_ui(tiny_engine, Handlers(tiny_engine)).get_config_file()
    assert not any(c["props"].get("elem_id") == "limits" for c in plain["components"])


# ------------------------------------------------------------------ through the queue


def test_the_queue_refuses_a_second_job_and_a_clients_extra_runs(shared_app, hold):
    """Every client, scripts included, is checked when its job joins the queue; the refusal is
    the job's error, as a gr.Error would be."""
    held = hold(shared_app.engine)
    ann = gradio_client.Client(shared_app.url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
    ann2 = gradio_client.Client(shared_app.url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
    bob = gradio_client.Client(shared_app.url, verbose=False, headers={"X-Forwarded-For": "203.0.113.8"})
    try:
        first = ann.submit(*call(), api_name="/generate")
        wait_until(lambda: held.started > 0, "the first run's first pass")
        with pytest.raises(Exception, match="You already have a run going"):
            ann.predict(*call(prompt="again"), api_name="/generate")  # the same session
        with pytest.raises(Exception, match="allows 1 at a time per visitor"):
            ann2.predict(*call(), api_name="/compare")  # the same visitor, another session
        with pytest.raises(Exception, match="allows at most 40 new tokens; got 41"):  # the slider's end
            bob.predict(*call(max_new_tokens=41), api_name="/generate")
        bobs = bob.submit(*call(prompt="Bob's"), api_name="/generate")  # another visitor may
        held.open()
        assert len(output(first.result(timeout=60), "api_tokens")) == 20 and len(output(bobs.result(timeout=60), "api_tokens")) >= 1
        assert len(output(ann.predict(*call(max_new_tokens=3), api_name="/generate"), "api_tokens")) == 3  # then again
    finally:
        held.open()
        for c in (ann, ann2, bob):
            c.close()


def test_refusals_nobody_reads_do_not_pile_up(shared_app, hold):
    """A script that joins the queue again and again without reading its stream: its refusals
    wait in memory only up to a bound, then come as HTTP 400s with the same message."""
    held = hold(shared_app.engine)
    fn = next(i for i, f in shared_app.demo.fns.items() if f.api_name == "generate")
    queue = shared_app.demo._queue
    body = {"data": call(), "fn_index": fn, "session_hash": "unread", "event_data": None, "trigger_id": None}
    try:
        with httpx.Client(base_url=shared_app.url, headers={"X-Forwarded-For": "192.0.2.77"}, timeout=30) as http:
            assert http.post("/gradio_api/queue/join", json=body).status_code == 200  # the run
            wait_until(lambda: held.started > 0, "the run's first pass")
            codes = [http.post("/gradio_api/queue/join", json=body) for _ in range(20)]
        statuses = [r.status_code for r in codes]
        # Refusals sent as the jobs' errors until 8 messages wait unread (the run's own count).
        n = statuses.count(200)
        assert n <= UNREAD_REFUSALS and statuses == [200] * n + [400] * (20 - n), statuses
        assert all(r.json()["detail"] == RUN_GOING for r in codes[n:])
        assert queue.pending_messages_per_session["unread"].qsize() <= UNREAD_REFUSALS + 4
    finally:
        held.open()
        shared_app.handlers.run.stop(SimpleNamespace(session_hash="unread"))


def test_sessions_per_client(shared_app):
    """Each new session a visitor names beyond their share is refused (429, the reason in the
    body) until one closes or idles out; other visitors are not affected."""
    h = shared_app.handlers
    # The page's load event: the link's settings, then the saved work (none here).
    fn, load = next((i, f) for i, f in shared_app.demo.fns.items() if (f.name or "").startswith("restore_then_"))
    data = [None] * len(load.inputs)

    def visit(session, address):
        return httpx.post(shared_app.url + "/gradio_api/run/predict", timeout=30,
                          headers={"X-Forwarded-For": address},
                          json={"data": data, "fn_index": fn, "session_hash": session})

    address = "192.0.2.44"
    for i in range(3):
        assert visit(f"s{i}", address).status_code == 200
    assert visit("s0", address).status_code == 200  # a session already held
    r = visit("s3", address)
    assert r.status_code == 429 and r.json()["detail"].startswith("You have 3 sessions open; the server allows 3")
    assert visit("t0", "192.0.2.45").status_code == 200
    # A body naming two sessions (a decoy nested inside, to be counted instead) is refused.
    r = httpx.post(shared_app.url + "/gradio_api/run/predict", timeout=30, headers={"X-Forwarded-For": address},
                   json={"data": data, "fn_index": fn, "event_data": {"session_hash": "s0"}, "session_hash": "s9"})
    assert r.status_code == 400
    h.run.closed(SimpleNamespace(session_hash="s1"))  # a tab closed: its session stops counting
    assert visit("s3", address).status_code == 200


def test_idle_sessions_expire():
    now = [0.0]
    s = Sessions(2, idle_s=60, clock=lambda: now[0])
    assert s.admit("c", "a") and s.admit("c", "b") and not s.admit("c", "x")
    now[0] = 30
    assert s.admit("c", "a") and not s.admit("c", "x")
    now[0] = 70  # b idle for 70 s
    assert s.admit("c", "x") and s.count("c") == 2


# ------------------------------------------------------------------ logins without the process list


def test_logins_from_env_and_file_never_echo_a_password(tmp_path, capsys):
    import app
    f = tmp_path / "logins"
    f.write_text("# who may log in\nann:pa:ss\n\nbob:hunter2\n")
    args = app.parse_args(["--auth-file", str(f)], environ={"TOKENLAB_AUTH": "cy:s3cret"})
    assert args.logins == [("ann", "pa:ss"), ("bob", "hunter2"), ("cy", "s3cret")]
    assert app.parse_args([], environ={}).logins == []
    f.write_text("ann:ok\nbob-without-password-hunter3\n")
    with pytest.raises(SystemExit):
        app.parse_args(["--auth-file", str(f)], environ={})
    with pytest.raises(SystemExit):
        app.parse_args([], environ={"TOKENLAB_AUTH": "nocolon-hunter4"})
    err = capsys.readouterr().err
    assert "line 2" in err and "TOKENLAB_AUTH" in err
    assert "hunter3" not in err and "hunter4" not in err


def test_login_from_a_file_guards_the_page_and_names_the_visitor(tiny_dirs, tmp_path):
    import app
    from inference.serving.engine import Engine
    from app import serve
    from ui.layout import build_ui
    f = tmp_path / "logins"
    f.write_text("ann:apple-pie\nbob:banana-split\n")
    args = app.parse_args(["--auth-file", str(f), "--sessions-per-client", "1"], environ={})
    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"])
    h = Handlers(engine, limits=app.limits_for(args))
    demo = build_ui(engine, h)
    _, url, _ = serve(demo, engine, block=False, auth=args.logins)
    try:
        with pytest.raises(Exception):
            gradio_client.Client(url, verbose=False, auth=("ann", "wrong"))
        assert httpx.get(url + "config").status_code in (401, 403)
        # One session each: ann and bob, from the same address, are two visitors.
        # Counted while both are open: a client that closes its heartbeat is a closed tab, whose
        # session stops counting (the page's unload), at once or a moment later.
        clients = []
        for who in (("ann", "apple-pie"), ("bob", "banana-split")):
            clients.append(gradio_client.Client(url, verbose=False, auth=who))
            assert len(output(clients[-1].predict(*call(max_new_tokens=2), api_name="/generate"), "api_tokens")) == 2
        assert h.page.admission.sessions.count("user ann") == 1 and h.page.admission.sessions.count("user bob") == 1
        for client in clients:
            client.close()
    finally:
        demo.close()
