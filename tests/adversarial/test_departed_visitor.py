"""Issue 59, finding 10: memory a stream of visitors leaves behind (measured by `python -m
bench.soak`, bench/measured/cpu-soak-smollm2-135m.md). What a visitor who has gone must not leave,
once their session's state has expired: its state and run record, its KV blocks, its job, its
binding to its owner (server/owners.py), a stop left for a job that never came, its count among
its client's sessions."""

from __future__ import annotations

import gc
import weakref

import pytest

from engine_hold import wait_until
from page_api import call, output
from served_page import page  # noqa: F401 - the fixture

gradio_client = pytest.importorskip("gradio_client")


def later(monkeypatch, keeper, owners, seconds: float) -> None:
    """The keeper's and the owners' clocks moved on: expiry is triggered, not waited for."""
    now, mono = keeper.clock, owners.clock
    monkeypatch.setattr(keeper, "clock", lambda: now() + seconds)
    monkeypatch.setattr(owners, "clock", lambda: mono() + seconds)


def test_a_departed_visitor_leaves_no_session_record_blocks_or_binding(page, monkeypatch):
    h = page.handlers.page
    keeper, owners, registry = h.keeper, h.owners, h.registry
    client = gradio_client.Client(page.url, verbose=False)
    session = client.session_hash
    assert output(client.predict(*call(max_new_tokens=4), api_name="/generate"), "api_tokens")
    state = keeper.state_of(session)
    page_of = keeper._app.get_blocks().tokenlab_page
    rec = state.state_data.get(page_of["record"]._id)
    refs = [weakref.ref(rec), weakref.ref(rec.steps[0]), weakref.ref(rec.done)]
    del rec, state
    assert owners.owner(session) is not None  # bound to the client's visitor key while it is there
    client.close()  # the tab closes: its heartbeat ends, the page's unload runs
    wait_until(lambda: keeper.closing(session), "the closed tab's unload")
    # A job this session's client cut before it registered (server/registry.py): left as a mark.
    registry.stop(session, starting=True)
    later(monkeypatch, keeper, owners, keeper.grace_s + 1)
    assert keeper.sweep_now() >= 1
    gc.collect()
    assert keeper.state_of(session) is None and not keeper.closing(session)
    assert [r() for r in refs] == [None, None, None], "the run's record outlived its session"
    assert owners.owner(session) is None and session not in owners._owner  # its binding went with it
    assert session not in registry._stopped and not registry.running(session)
    assert all(session not in held for held in h.admission.sessions._by_client.values())
    stats = page.engine.scheduler.stats()
    assert stats.active_runs == 0 and stats.blocks_used - stats.blocks_cached == 0


def test_a_binding_that_never_got_state_goes_once_idle(page, monkeypatch):
    """A script that names sessions and never makes one (a refused request, a stream of nothing):
    each name it bound is let go of once idle, so what is kept is bounded by what is in use."""
    import httpx
    h = page.handlers.page
    keeper, owners = h.keeper, h.owners
    names = [f"never-{i}" for i in range(5)]
    for name in names:  # a stream of a session that holds nothing: gradio answers "not found"
        httpx.get(page.url + "/gradio_api/queue/data", params={"session_hash": name}, timeout=60)
    assert all(n in owners._owner for n in names)
    later(monkeypatch, keeper, owners, owners.idle_s + 1)
    keeper.sweep_now()
    assert not any(n in owners._owner for n in names)
