"""A closed tab's state is freed: through a real server, a session that closes leaves no run
record, conversation or engine event of its own alive once its expiry is triggered, a session
still open keeps its state, and the sessions kept never exceed the cap (server/sessions.py)."""

import gc
import secrets
import weakref
from types import SimpleNamespace

import pytest

import page_api
from engine_hold import wait_until
from page_api import output
from server.limits import Limits
from server.sessions import MIN_SESSIONS, SessionKeeper, session_capacity

gradio_client = pytest.importorskip("gradio_client")

CAP = 4


def call(**kw):
    """/generate's values by name: a short greedy run (6 tokens) unless `kw` says otherwise."""
    return page_api.call(**{"max_new_tokens": 6, **kw})


def later(keeper: SessionKeeper, monkeypatch, seconds: float) -> None:
    """The keeper's clock moved on by `seconds`: expiry is triggered, not waited for."""
    now = keeper.clock
    monkeypatch.setattr(keeper, "clock", lambda: now() + seconds)


def record_of(keeper, session):
    """The RunRecord the session's "record" gr.State holds on the server."""
    state = keeper.state_of(session)
    page = keeper._app.get_blocks().tokenlab_page
    return None if state is None else state.state_data.get(page["record"]._id)


@pytest.fixture(scope="module")
def capped_app(tiny_dirs):
    """The page, its sessions capped at CAP."""
    from conftest import no_early_end
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui

    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    no_early_end(engine)
    handlers = Handlers(engine, limits=Limits.local(session_capacity=CAP))
    demo = build_ui(engine, handlers)
    app, url, _ = serve(demo, engine, block=False)
    yield SimpleNamespace(url=url.rstrip("/"), engine=engine, handlers=handlers, demo=demo, app=app)
    demo.close()
    engine.close()


def test_capacity_comes_from_the_memory_available():
    gib = 1024 ** 3
    assert session_capacity(None, 64 * gib) == 4096  # 8 GiB for sessions of 2 MiB
    assert session_capacity(256, 64 * gib) == 256  # a shared page's own cap
    assert session_capacity(None, 10**12) == 10_000
    assert session_capacity(None, 0) == MIN_SESSIONS
    assert session_capacity(3, 0) == 3


def test_a_closed_api_session_leaves_no_record_or_event_alive(capped_app, monkeypatch):
    app, keeper = capped_app, capped_app.handlers.page.keeper
    client = gradio_client.Client(app.url, verbose=False)
    session = client.session_hash
    final = client.predict(*call(), api_name="/generate")
    assert output(final, "api_tokens")  # the run's tokens
    rec = record_of(keeper, session)
    assert rec is not None and rec.done is not None and len(rec.steps) == 6
    refs = [weakref.ref(rec), weakref.ref(rec.steps[0]), weakref.ref(rec.steps[-1]), weakref.ref(rec.done)]
    del rec
    # While the client is there its state is kept, however long it stays idle.
    later(keeper, monkeypatch, 10 * keeper.idle_s)
    keeper.sweep_now()
    assert keeper.state_of(session) is not None
    client.close()  # its heartbeat ends: the page's unload runs
    wait_until(lambda: keeper.closing(session), "the unload of the closed session")
    keeper.sweep_now()
    assert keeper.state_of(session) is not None  # the grace period has not begun yet
    later(keeper, monkeypatch, 10 * keeper.idle_s + keeper.grace_s + 1)
    keeper.sweep_now()
    assert keeper.state_of(session) is None and not keeper.closing(session)
    messages = app.app.get_blocks()._queue.pending_messages_per_session.get(session)
    assert messages is None or messages.empty()  # its unread messages went with it
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_a_session_without_a_heartbeat_expires_when_idle(capped_app, monkeypatch):
    from bench.page_client import PageClient
    app, keeper = capped_app, capped_app.handlers.page.keeper
    before = set(app.app.state_holder.session_data)
    PageClient(app.url).run(call())  # a raw API client: joins the queue, opens no heartbeat
    new = set(app.app.state_holder.session_data) - before
    assert len(new) == 1
    keeper.sweep_now()
    assert new <= set(app.app.state_holder.session_data)  # not idle yet
    (session,) = new
    with app.handlers.page.runs._lock:  # as a click that the engine never took would leave it
        app.handlers.page.runs._waiting[session] = 0.0
        app.handlers.page.runs._stopped_waiting.add(session)
    trims = []  # the allocator's free pages, given back once the session's are freed
    monkeypatch.setattr(keeper, "_trim", trims.append)
    monkeypatch.setattr(keeper, "_trimmed_at", 0.0)
    later(keeper, monkeypatch, keeper.idle_s + 1)
    keeper.sweep_now()
    assert not new & set(app.app.state_holder.session_data)
    assert session not in app.handlers.page.runs._waiting and session not in app.handlers.page.runs._stopped_waiting
    assert trims == [0]


def test_the_sessions_kept_never_exceed_the_cap(capped_app):
    app, keeper = capped_app, capped_app.handlers.page.keeper
    clients = []
    try:
        for i in range(CAP + 3):  # each stays open: only the cap lets go of the oldest
            clients.append(gradio_client.Client(app.url, verbose=False))
            assert output(clients[-1].predict(*call(max_new_tokens=2, seed=str(i)), api_name="/generate"), "api_tokens")
            assert keeper.kept() <= CAP
        assert keeper.kept() == CAP
        assert keeper.state_of(clients[-1].session_hash) is not None
        assert keeper.state_of(clients[0].session_hash) is None
    finally:
        for c in clients:
            c.close()


def test_a_closed_tab_leaves_no_record_or_conversation_alive(live_app, browser, monkeypatch):
    """A chat turn in a real browser tab; the tab closes; its expiry is triggered."""
    from browser import open_page, settled_after, wait_loaded
    url, _, handlers = live_app
    keeper, holder = handlers.page.keeper, handlers.page.keeper._app.state_holder
    marker = f"remember {secrets.token_hex(6)}"
    page = open_page(browser)
    page.goto(url + "/?mode=chat&max_new_tokens=4&temperature=1&seed=2")
    wait_loaded(page)
    page.fill("#prompt textarea", marker)
    settled_after(page, lambda: page.click("#generate"))  # the run and every event after it ended
    page.wait_for_function("(document.querySelector('#conversation')?.innerText || '').includes('remember')")

    def turn_alive() -> bool:  # a conversation holding the turn (gc tracks lists, not these dicts)
        return any(type(o) is list and any(type(m) is dict and m.get("content") == marker for m in o)
                   for o in gc.get_objects())

    session = next(s for s, state in list(holder.session_data.items())
                   if any(isinstance(v, list) and any(m.get("content") == marker for m in v)
                          for v in state.state_data.values()))
    rec = record_of(keeper, session)
    assert rec is not None and rec.user_message == marker
    refs = [weakref.ref(rec), weakref.ref(rec.steps[0]), weakref.ref(rec.done)]
    del rec
    assert turn_alive()
    page.close(run_before_unload=True)
    wait_until(lambda: keeper.closing(session), "the unload of the closed tab")
    later(keeper, monkeypatch, keeper.grace_s + 1)
    keeper.sweep_now()
    assert keeper.state_of(session) is None
    # The record and the conversation may still be inputs of the tab's last event in flight (saving
    # its work in the browser, after the turn): they go when that event ends.
    wait_until(lambda: gc.collect() is not None and [r() for r in refs] == [None] * len(refs), "the record let go of")
    wait_until(lambda: gc.collect() is not None and not turn_alive(), "the conversation let go of")


def test_reset_marks_of_cancelled_events_go_once_old(capped_app, monkeypatch):
    """Gradio's mark of a cancelled event stays until that event runs again, which it mostly
    never does: one per stopped run. The sweep lets it go after RESET_MARK_S, not before."""
    from server.sessions import RESET_MARK_S
    app, keeper = capped_app, capped_app.handlers.page.keeper
    marks = app.app.iterators_to_reset
    marks.add("a-cancelled-event")
    keeper.sweep_now()
    assert "a-cancelled-event" in marks  # young: its event may still come back once
    now = keeper.mark_clock
    monkeypatch.setattr(keeper, "mark_clock", lambda: now() + RESET_MARK_S / 2)
    marks.add("a-later-one")
    keeper.sweep_now()
    assert {"a-cancelled-event", "a-later-one"} <= marks
    monkeypatch.setattr(keeper, "mark_clock", lambda: now() + RESET_MARK_S + 1)
    keeper.sweep_now()
    assert "a-cancelled-event" not in marks and "a-later-one" in marks


def test_keeper_ignores_closes_before_launch():
    keeper = SessionKeeper(registry=None)
    keeper.closed("s")
    assert not keeper.closing("s") and keeper.sweep() == 0 and keeper.kept() == 0


@pytest.mark.slow  # waits for the sweep's own timer
def test_the_sweep_runs_on_its_own(capped_app, monkeypatch):
    """No call triggers it: the server's loop sweeps every few seconds once a request came."""
    app, keeper = capped_app, capped_app.handlers.page.keeper
    deleted = keeper.deleted
    client = gradio_client.Client(app.url, verbose=False)
    session = client.session_hash
    client.predict(*call(max_new_tokens=2), api_name="/generate")
    client.close()
    wait_until(lambda: keeper.closing(session), "the unload of the closed session")
    later(keeper, monkeypatch, keeper.grace_s + 1)
    # The count goes up after the state is gone (on the server's loop): wait for the count.
    wait_until(lambda: keeper.deleted > deleted, "a sweep that deletes it")
    assert keeper.state_of(session) is None


def test_visitors_that_left_are_not_kept_in_the_session_counts():
    from server.guard import Sessions
    now = [0.0]
    counts = Sessions(2, idle_s=10, clock=lambda: now[0])
    assert counts.admit("address a", "s1") and counts.admit("address b", "s2")
    counts.forget("s1")
    now[0] = 11
    counts.prune()
    assert counts.count("address a") == counts.count("address b") == 0
    assert not counts._by_client  # neither client is kept
