"""Issue 59, finding 1: a run whose stream is cut ends at its next step, whatever its kind. A
page client started a beam search (or a speculative run) and left, and the run went on for
minutes holding thousands of KV blocks: gradio closes an event that streams when its client goes,
but runs one that returns once to its end. Now a client that leaves (its stream of messages
closed) or cancels (gradio's /cancel) ends its engine job at the next step, its blocks back in
the pool; so does an API client that disconnects, streaming or not.

The engine is held before each forward pass (tests/engine_hold.py): the cut comes while a pass
waits, and no pass starts after it."""

from __future__ import annotations

import socket
import threading
import time
import httpx
import pytest

from engine_hold import TIMEOUT_S, wait_until
from ui.controls import Controls
from served_page import page  # noqa: F401 - the fixture

# A failing run waits for its client for ever (the fault this file guards); the hold lets it go
# only when it is cancelled, so a broken fix shows as this wait running out, never as a speed.
ENDS_WITHIN_S = 120


def fn_index(demo, name: str) -> int:
    return next(i for i, f in demo.fns.items() if f.name == name)


def inputs(kind: str) -> tuple[str, list]:
    """(the page's handler, its inputs) for a long run of each kind."""
    c = Controls(prompt="The quick brown fox", max_new_tokens=100, seed="3")
    if kind == "beam search":
        return "beam_search", Controls(prompt="The quick brown fox", max_new_tokens=100, num_beams=8,
                                       temperature=0.0).values()
    if kind == "speculative":
        return "speculative", [*Controls(prompt="The quick brown fox", max_new_tokens=100, temperature=0.0).values(),
                               "prompt-lookup", 1, 4]
    if kind == "samples":
        return "samples", [*c.values(), 8]
    return "generate", c.values()


class SpecHold:
    """Holds a speculative run before each round's target pass until a pass is allowed or the
    run is cancelled (speculative rounds run on the caller's thread, outside the scheduler)."""

    def __init__(self, monkeypatch):
        from inference.decoding import speculative
        self.started, self.allowed, self.cancels, self._cond = 0, 0, [], threading.Condition()
        rows, run = speculative.PagedSequence.rows, speculative.Speculator.run

        def held_rows(seq, tokens, start):
            with self._cond:
                n = self.started
                self.started += 1
                self._cond.notify_all()
                # A cancel flag set elsewhere notifies nobody: look again every 10 ms.
                deadline = time.monotonic() + TIMEOUT_S
                while not (self.allowed > n or any(c.is_set() for c in self.cancels)):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"round {n} was held for {TIMEOUT_S:.0f} s")
                    self._cond.wait(0.01)
            return rows(seq, tokens, start)

        def tracked(spec, request, cancel=None):
            if cancel is not None:
                self.cancels.append(cancel)
            return run(spec, request, cancel)

        monkeypatch.setattr(speculative.PagedSequence, "rows", held_rows)
        monkeypatch.setattr(speculative.Speculator, "run", tracked)

    def allow(self, n: int) -> None:
        with self._cond:
            self.allowed += n
            self._cond.notify_all()


def cut_while_held(page, hold, monkeypatch, kind: str, how: str) -> tuple[int, int]:
    """Start a run of `kind` as a page client does (queue/join, then its stream of messages),
    cut it while a forward pass waits (`how`: the client leaves, or cancels), and wait for it
    to end. (passes started when it was cut, passes started in all)."""
    engine, registry = page.engine, page.handlers.page.registry
    held = SpecHold(monkeypatch) if kind == "speculative" else hold(engine)
    name, data = inputs(kind)
    fn, session = fn_index(page.demo, name), f"cut-{kind}-{how}".replace(" ", "-")
    with httpx.Client(base_url=page.url, timeout=60) as http:
        r = http.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn, "session_hash": session,
                                                      "event_data": None, "trigger_id": None})
        assert r.status_code == 200, r.text
        event_id = r.json()["event_id"]
        with http.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}):
            held.allow(2)
            wait_until(lambda: held.started >= 3, "the run's third forward pass")
            at_cut = held.started
            if how == "cancels":
                r = http.post("/gradio_api/cancel", json={"session_hash": session, "fn_index": fn,
                                                          "event_id": event_id})
                assert r.status_code == 200, r.text
        # how == "leaves": the stream closes here, the client gone
        wait_until(lambda: not registry.running(session), f"the {kind} run's end", ENDS_WITHIN_S)
    return at_cut, held.started


@pytest.mark.parametrize("how", ["leaves", "cancels"])
@pytest.mark.parametrize("kind", ["beam search", "speculative", "samples", "plain"])
def test_a_cut_page_run_ends_at_its_next_step_and_gives_its_blocks_back(page, hold, monkeypatch, kind, how):
    at_cut, passes = cut_while_held(page, hold, monkeypatch, kind, how)
    assert passes == at_cut, f"{passes - at_cut} forward passes after the cut"
    stats = page.engine.scheduler.stats()
    assert stats.active_runs == 0 and stats.blocks_used - stats.blocks_cached == 0 and stats.blocks_reserved == 0
    assert len(page.handlers.page.registry) == 0


def _api_request(page, path: str, body: dict):
    """Send a request on a raw socket (the client that leaves closes it mid-answer)."""
    import json
    payload = json.dumps(body).encode()
    host, port = page.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return s


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "The quick", "max_tokens": 100, "use_beam_search": True, "n": 8}),
    ("/v1/completions", {"prompt": "The quick", "max_tokens": 100, "n": 3, "seed": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "n": 2,
                              "stream": True, "seed": 1}),
], ids=["beam search", "samples", "streamed"])
def test_an_api_client_that_leaves_ends_its_runs_at_the_next_step(page, hold, path, body):
    engine = page.engine
    held = hold(engine)
    s = _api_request(page, path, body)
    try:
        held.allow(2)
        wait_until(lambda: held.started >= 3, "the request's third forward pass")
        at_cut = held.started
    finally:
        s.close()  # the client is gone
    wait_until(lambda: engine.active_runs == 0, "the request's runs' end", ENDS_WITHIN_S)
    assert held.started == at_cut, f"{held.started - at_cut} forward passes after the client left"
    stats = engine.scheduler.stats()
    assert stats.blocks_used - stats.blocks_cached == 0 and stats.blocks_reserved == 0
    wait_until(lambda: len(page.handlers.page.registry) == 0, "the request's jobs given back", ENDS_WITHIN_S)
