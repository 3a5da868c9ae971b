"""Issue 59, findings 4 and 7: a visitor's session is theirs, and a public page says no more than
it must. With two logins, login B replayed login A's session hash and read A's prompt and steps
through /branch and inspect_step; anyone could cancel anyone's event; the page before login
embedded the API's whole description, and /openapi.json listed every route.

Each session is bound at its first use to its visitor (their login, else a random 128-bit cookie
the server sets: server/owners.py); a request that names it from anyone else is refused, 403."""

from __future__ import annotations

import json
import logging
import re
from types import SimpleNamespace

import httpx
import pytest

from engine_hold import wait_until
from page_api import call, output
from server.guard import served
from served_page import page  # noqa: F401 - the fixture

gradio_client = pytest.importorskip("gradio_client")

LOGINS = [("ann", "apple-pie"), ("bob", "banana-split")]
VISITOR_COOKIE = "tokenlab-visitor"  # server.owners.VISITOR_COOKIE


@pytest.fixture(scope="module")
def login_page(tiny_dirs):
    from app import serve
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from ui.layout import build_ui

    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    engine.eos_ids = set()
    handlers = Handlers(engine)
    demo = build_ui(engine, handlers)
    _, url, _ = serve(demo, engine, block=False, auth=LOGINS)
    yield SimpleNamespace(url=url.rstrip("/"), engine=engine, handlers=handlers, demo=demo)
    demo.close()
    engine.close()


def fn(demo, name: str) -> int:
    return next(i for i, f in demo.fns.items() if f.api_name == name)


def joined(url, cookies, fn_index, data, session) -> httpx.Response:
    return httpx.post(url + "/gradio_api/queue/join", cookies=cookies, timeout=60,
                      json={"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
                            "trigger_id": None})


def test_another_login_cannot_use_a_sessions_runs_tree_steps_or_downloads(login_page):
    url, demo = login_page.url, login_page.demo
    ann, bob = (gradio_client.Client(url, verbose=False, auth=who) for who in LOGINS)
    try:
        assert len(output(ann.predict(*call(prompt="Ann's secret plan", max_new_tokens=3), api_name="/generate"),
                          "api_tokens")) == 3
        session = ann.session_hash
        not_yours = "This session belongs to another visitor."
        for name, data in (("branch", [0, 5]), ("generate", call()), ("inspect_step", None)):
            index = fn(demo, name) if name != "inspect_step" else next(
                i for i, f in demo.fns.items() if f.name == "inspect_step")
            r = joined(url, bob.cookies, index, data if data is not None else [None, 0, 0, 0], session)
            assert r.status_code == 403 and r.json()["detail"] == not_yours, (name, r.text)
        for path in (f"/gradio_api/queue/data?session_hash={session}", f"/gradio_api/heartbeat/{session}"):
            r = httpx.get(url + path, cookies=bob.cookies, timeout=60)
            assert r.status_code == 403 and "Ann" not in r.text, path
        r = httpx.post(url + "/gradio_api/cancel", cookies=bob.cookies, timeout=60,
                       json={"session_hash": session, "fn_index": fn(demo, "generate"), "event_id": "x"})
        assert r.status_code == 403
        # Ann's own session still serves her.
        assert len(output(ann.predict(*call(max_new_tokens=2), api_name="/generate"), "api_tokens")) == 2
    finally:
        ann.close()
        bob.close()
    # A download of a run made under a login is that login's only.
    h = login_page.handlers
    address = h.page.runs.downloads.write("run-1.jsonl", "Ann's steps\n", "ann")
    _, token, name = address.rsplit("/", 2)
    downloads = h.page.runs.downloads
    assert downloads.path(token, name, "bob") is None and downloads.path(token, name, "ann") is not None
    with httpx.Client(base_url=url, timeout=60) as http:
        http.post("/login", data={"username": "bob", "password": "banana-split"})
        r = http.get("/" + address)
        assert r.status_code == 404 and "Ann" not in r.text
    with httpx.Client(base_url=url, timeout=60) as http:
        http.post("/login", data={"username": "ann", "password": "apple-pie"})
        assert http.get("/" + address).text == "Ann's steps\n"


def test_before_login_the_page_is_the_login_form_and_the_api_is_not_described(login_page):
    url = login_page.url
    page = httpx.get(url + "/", timeout=60).text
    assert "window.gradio_api_info = null;" in page and "named_endpoints" not in page and "/generate" not in page
    assert httpx.get(url + "/openapi.json", timeout=60).status_code == 401
    for path in ("/gradio_api/info", "/gradio_api/openapi.json", "/config"):
        assert httpx.get(url + path, timeout=60).status_code == 401, path
    r = httpx.post(url + "/gradio_api/cancel", json={"session_hash": "s", "fn_index": 0, "event_id": "e"}, timeout=60)
    assert r.status_code == 401
    assert httpx.get(url + "/gradio_api/heartbeat/s", timeout=60).status_code == 401
    with httpx.Client(base_url=url, timeout=60) as http:
        http.post("/login", data={"username": "ann", "password": "apple-pie"})
        assert http.get("/openapi.json").status_code == 200 and "named_endpoints" in http.get("/").text


def test_without_logins_a_visitor_cancels_and_uses_only_their_own_sessions(page, hold):
    url, demo, engine = page.url, page.demo, page.engine
    held = hold(engine)
    a, b = gradio_client.Client(url, verbose=False), gradio_client.Client(url, verbose=False)
    try:
        key_a, key_b = a.cookies.get(VISITOR_COOKIE), b.cookies.get(VISITOR_COOKIE)
        assert re.fullmatch(r"[0-9a-f]{32}", key_a) and re.fullmatch(r"[0-9a-f]{32}", key_b) and key_a != key_b
        job = a.submit(*call(prompt="A's run", max_new_tokens=30, temperature=1.0, seed=""), api_name="/generate")
        wait_until(lambda: held.started > 0, "A's run's first pass")
        r = httpx.post(url + "/gradio_api/cancel", cookies=b.cookies, timeout=60,
                       json={"session_hash": a.session_hash, "fn_index": fn(demo, "generate"), "event_id": "x"})
        assert r.status_code == 403
        r = joined(url, b.cookies, fn(demo, "branch"), [0, 5], a.session_hash)
        assert r.status_code == 403
        r = joined(url, {}, fn(demo, "branch"), [0, 5], a.session_hash)  # no cookie at all: anonymous
        assert r.status_code == 403
        assert page.handlers.page.registry.running(a.session_hash)  # A's run goes on
        held.open()
        assert output(job.result(timeout=60), "api_tokens")  # it ran to its end
    finally:
        held.open()
        a.close()
        b.close()


def test_the_page_sets_a_random_private_visitor_key(page):
    from server.owners import VISITOR_COOKIE as name
    assert name == VISITOR_COOKIE
    keys = set()
    for _ in range(3):
        r = httpx.get(page.url + "/", timeout=60)
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
        keys.add(re.match(rf"{VISITOR_COOKIE}=([0-9a-f]{{32}});", cookie)[1])
    assert len(keys) == 3


def test_openapi_lists_only_what_a_visitor_may_call(page):
    paths = httpx.get(page.url + "/openapi.json", timeout=60).json()["paths"]
    assert paths and all(served(re.sub(r"\{[^}]*\}", "x", p)) for p in paths)
    assert not any(p.startswith(("/monitoring", "/gradio_api/upload", "/gradio_api/file")) for p in paths)


def test_a_session_hash_is_in_no_link_download_or_log(page, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    client = gradio_client.Client(page.url, verbose=False)
    try:
        client.predict(*call(max_new_tokens=3), api_name="/generate")
        session = client.session_hash
    finally:
        client.close()
    h = page.handlers
    rec = list(h.run.generate(*call(max_new_tokens=3), SimpleNamespace(session_hash=session)))[-1]["record"]
    drawn = h.page.runs.drawn(rec)
    link = h.share.share_link(*call(max_new_tokens=3), "http://x/", "", None)
    files = [h.page.runs.downloads.path(*u.rsplit("/", 2)[1:]).read_text()
             for u in re.findall(r"tokenlab/download/[0-9a-f]+/[\w.-]+", drawn["downloads"])]
    assert len(files) == 2
    # The server's log (the test's own HTTP clients log the addresses they ask for, not the server)
    logged = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))) \
        + capfd.readouterr().err
    for where, text in (("link", json.dumps(link)), ("downloads", "".join(files) + drawn["downloads"]),
                        ("log", logged)):
        assert session not in text, where
