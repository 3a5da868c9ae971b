"""Holding an engine's runs where a test wants them, so that no outcome depends on how fast the
machine is: a tiny model finishes a whole run before a Stop, a closed tab or a full queue could
otherwise be seen."""

from __future__ import annotations

import math
import threading
import time

from inference.serving.run import prefill_shares

TIMEOUT_S = 240.0  # only a broken test waits this long (a page start beside a loaded CI machine took 60+ s)


class Hold:
    """Holds the engine's scheduler before each forward pass that makes a token for a stoppable
    run (one given a cancel flag, as every page run is). Pass n (counted from 0 over all such
    passes) starts once the test has allowed more than n passes, or as soon as one of its runs
    is cancelled: a held run that is stopped or disconnected then ends within one step. Passes
    of runs without a cancel flag only are not held."""

    def __init__(self, monkeypatch, engine):
        self.allowed = 0
        self.started = 0  # passes that have begun (run or waiting)
        self.ended = 0  # held runs that have ended
        self._cond = threading.Condition()
        self._held: set[int] = set()  # id() of the cancel flags of held runs
        self._monkeypatch = monkeypatch
        step, run, generate_many = engine.scheduler._step, engine.run, engine.generate_many
        expand_tree = engine.expand_tree

        def held_while(events, cancel):
            if cancel is not None:
                self._held.add(id(cancel))
            try:
                yield from events
            finally:
                if cancel is not None:
                    with self._cond:
                        self._held.discard(id(cancel))
                        self.ended += 1
                        self._cond.notify_all()

        def tracked(request, cancel=None):  # every run but a batch of samples goes through run()
            return held_while(run(request, cancel), cancel)

        def tracked_many(ids, params, n, top_n=10, cancel=None):  # a batch of samples: one flag
            return held_while(generate_many(ids, params, n, top_n, cancel), cancel)

        def tracked_tree(*args, cancel=None, **kwargs):  # a loom's tree: one run, a level a pass
            return held_while(expand_tree(*args, cancel=cancel, **kwargs), cancel)

        chunk = engine.scheduler.prefill_chunk

        def makes_a_token(run, shares) -> bool:  # a pass that only feeds a prompt's first chunks is not held
            return run.prefilled == run.n_prompt or shares[id(run)] == run.n_prompt - run.prefilled

        def held(active):
            shares = prefill_shares(active, chunk)  # as the pass will read them
            cancels = [r.cancel for r in active if id(r.cancel) in self._held and makes_a_token(r, shares)]
            if cancels:
                with self._cond:
                    n = self.started
                    self.started += 1
                    self._cond.notify_all()
                    # A cancel flag set elsewhere notifies nobody: look again every 10 ms.
                    if not _wait(self._cond, lambda: self.allowed > n or any(c.is_set() for c in cancels), 0.01):
                        raise TimeoutError(f"forward pass {n} was held for {TIMEOUT_S:.0f} s")
            return step(active)

        monkeypatch.setattr(engine, "run", tracked)
        monkeypatch.setattr(engine, "generate_many", tracked_many)
        monkeypatch.setattr(engine, "expand_tree", tracked_tree)
        monkeypatch.setattr(engine.scheduler, "_step", held)

    def allow(self, n: int = 1) -> None:
        """Let held runs make n more forward passes (tokens)."""
        with self._cond:
            self.allowed += n
            self._cond.notify_all()

    def step(self, n: int) -> None:
        """Let the run make n more tokens, and wait until it is held again."""
        ended = self.ended
        self.allow(n)
        with self._cond:
            assert _wait(self._cond, lambda: self.started > self.allowed or self.ended > ended), \
                f"no run reached forward pass {self.allowed} within {TIMEOUT_S:.0f} s"
            assert self.started > self.allowed, f"the run ended before forward pass {self.allowed}"

    def open(self) -> None:
        """Let every run go, now and later."""
        self.allow(math.inf)

    def close(self) -> None:
        """Hold again from the next pass on (between runs)."""
        with self._cond:
            self.allowed = self.started

    def one_token_per_update(self) -> None:
        """Let runs make one more token each time the page's handler makes an update: a run
        never gets ahead of the page, and stops advancing when the page stops taking updates."""
        from ui.shared.runs import Runs
        outputs = Runs.outputs

        def paced(handlers, *args, **kwargs):
            self.allow(1)
            return outputs(handlers, *args, **kwargs)

        self._monkeypatch.setattr(Runs, "outputs", paced)


def _wait(cond: threading.Condition, predicate, poll_s: float | None = None) -> bool:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        cond.wait(min(left, poll_s) if poll_s else left)
    return True


def wait_until(predicate, what: str = "the condition", timeout_s: float = TIMEOUT_S) -> None:
    """Wait for something that is certain to happen (the timeout only ends a broken test)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:.0f} s"
        time.sleep(0.01)


def hold_passes(monkeypatch, engine, free: int = 0) -> threading.Event:
    """Hold the scheduler's forward passes after the first `free` until the event returned is set
    (runs of a test's own then meet in one step, or a test acts between two of them)."""
    go, step, passes = threading.Event(), engine.scheduler._step, []

    def held(active):
        passes.append(1)
        if len(passes) > free:
            assert go.wait(TIMEOUT_S), f"forward pass {len(passes) - 1} was held for {TIMEOUT_S:.0f} s"
        return step(active)
    monkeypatch.setattr(engine.scheduler, "_step", held)
    return go


def fail_mid_run(monkeypatch, engine, error: Exception) -> None:
    """The engine's runs raise `error` after their first event (an engine error mid-run), for
    the rest of the test."""
    real = engine.run

    def failing(*args, **kwargs):
        events = real(*args, **kwargs)
        try:
            yield next(events)
        finally:
            events.close()
        raise error
    monkeypatch.setattr(engine, "run", failing)
