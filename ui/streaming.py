"""Streaming a run to the page: the engine on its own thread, events handed over in batches,
and the registry of each browser session's running run."""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

import gradio as gr

from inference.errors import TokenLabError

CHART_INTERVAL_S = 0.5  # the charts, larger to send and draw, at most twice a second


def update_interval_for(engine) -> float:
    """Seconds between streamed page updates. On a CPU each update's serialization takes a core
    and the GIL from the engine's thread: on 2 cores, at 10 updates a second the page received
    84% of the engine's decode rate alone, at 5 a second 90% (four alternated runs each, with
    bench/run.py's client)."""
    return 0.1 if engine.device.type == "cuda" else 0.2


class RunRegistry:
    """The cancel flag of each browser session's current run (Stop and closed tabs set it)."""

    def __init__(self):
        self._runs: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def start(self, session: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            old = self._runs.get(session)
            if old is not None:  # one run per session: a new Generate ends the old one
                old.set()
            self._runs[session] = event
        return event

    def stop(self, session: str) -> None:
        with self._lock:
            event = self._runs.get(session)
        if event is not None:
            event.set()

    def finish(self, session: str, event: threading.Event) -> None:
        with self._lock:
            if self._runs.get(session) is event:
                del self._runs[session]

    def __len__(self) -> int:
        return len(self._runs)


class EventPump:
    """Runs the engine's event generator on its own thread, so the engine keeps decoding while
    the page's previous update is serialized and sent; the handler takes events in batches."""

    _END = object()

    def __init__(self, events: Iterator, cancel: threading.Event):
        self._queue: queue.Queue = queue.Queue()
        self._cancel = cancel
        self._thread = threading.Thread(target=self._run, args=(events,), daemon=True, name="tokenlab-run")
        self._thread.start()

    def _run(self, events: Iterator) -> None:
        try:
            for ev in events:
                self._queue.put(ev)
        except BaseException as e:  # handed to the page's thread, which reports it
            self._queue.put(e)
        finally:
            self._queue.put(self._END)

    def batches(self, interval_s: float) -> Iterator[list]:
        """Lists of events, one list at most every interval_s (an empty one when nothing came:
        a queued run's page still shows its wait growing); ends after the last event."""
        while True:
            try:
                batch = [self._queue.get(timeout=interval_s)]
            except queue.Empty:
                yield []
                continue
            deadline = time.perf_counter() + interval_s
            while batch[-1] is not self._END and (left := deadline - time.perf_counter()) > 0:
                try:
                    batch.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
            done = batch[-1] is self._END
            events = [e for e in batch if e is not self._END]
            for e in events:
                if isinstance(e, BaseException):
                    if isinstance(e, TokenLabError):
                        raise gr.Error(str(e), print_exception=False)
                    raise e
            yield events
            if done:
                return

    def close(self) -> None:
        """Stop the engine (if it still runs) and wait for its thread: the KV cache is freed."""
        self._cancel.set()
        self._thread.join()
