"""Holding the page's runs where a browser test wants them, so that nothing depends on how fast
the machine is: a tiny model finishes a run before a person (or Playwright) could see it."""

from __future__ import annotations

import math
import threading
import time

TIMEOUT_S = 60.0  # only a broken test waits this long


class Hold:
    """Holds every forward pass of the engine's stoppable runs (the page's runs, which carry a
    cancel flag) until the test allows it; a cancelled run is let go at once, so Stop and closed
    tabs still end it within a step. Other forward passes (replay, scoring, looking inside a
    step) are never held."""

    def __init__(self, monkeypatch, engine):
        self.allowed = 0  # forward passes the test has let go, over all held runs
        self.started = 0  # forward passes that have begun (run or waiting)
        self._cond = threading.Condition()
        self._run = threading.local()
        forward, generate_ids = engine.model.forward, engine.generate_ids

        def tracked(ids, params, top_n=10, cancel=None):
            self._run.cancel = cancel  # the generator's body runs on the engine's thread
            yield from generate_ids(ids, params, top_n, cancel)

        def held(*args, **kwargs):
            cancel = getattr(self._run, "cancel", None)
            if cancel is not None:
                with self._cond:
                    n = self.started
                    self.started += 1
                    self._cond.notify_all()
                    deadline = time.monotonic() + TIMEOUT_S
                    while not (self.allowed > n or cancel.is_set()):
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"forward pass {n} was held for {TIMEOUT_S:.0f} s")
                        self._cond.wait(0.01)  # a cancel flag set elsewhere notifies nobody
            return forward(*args, **kwargs)

        monkeypatch.setattr(engine, "generate_ids", tracked)
        monkeypatch.setattr(engine.model, "forward", held)

    def allow(self, n: int = 1) -> None:
        with self._cond:
            self.allowed += n
            self._cond.notify_all()

    def open(self) -> None:
        """Let every run go, now and later."""
        self.allow(math.inf)

    def wait_started(self, n: int) -> None:
        """Wait until n forward passes have begun (the n-th may be held)."""
        with self._cond:
            deadline = time.monotonic() + TIMEOUT_S
            while self.started < n:
                assert time.monotonic() < deadline, f"forward pass {n} did not begin"
                self._cond.wait(0.05)


def bias_token(monkeypatch, engine, token_id: int, every: int = 3, by: float = 1e4) -> None:
    """Make the model pick `token_id` on every `every`-th decode step (its logit raised), so a
    run's output is certain to hold that token (a newline, say) whatever the random weights."""
    forward = engine.model.forward
    calls = {"n": 0}

    def biased(*args, **kwargs):
        logits = forward(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] % every == 0 and logits.dim() == 2:
            logits = logits.clone()
            logits[:, token_id] += by
        return logits

    monkeypatch.setattr(engine.model, "forward", biased)
