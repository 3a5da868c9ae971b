"""Streaming a run to the page: the engine on its own thread, events handed over in batches, at
a pace that leaves the engine its cores."""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

import gradio as gr

from inference.errors import TokenLabError
from inference.events import StepEvent, WaitEvent
from ui.controls import page_message

CHART_INTERVAL_S = 0.5  # the charts, larger to send and draw, at most twice a second
RUNS_PER_INTERVAL = 4  # beyond this many runs at once, each run's page updates come less often


def update_interval_for(info) -> float:
    """Seconds between streamed page updates. On a CPU each update's serialization takes a core
    and the GIL from the engine's thread: on 2 cores, at 10 updates a second the page received
    84% of the engine's decode rate alone, at 5 a second 90% (four alternated runs each, with
    bench/run.py's client). In front of a server the page does not decode: 10 a second."""
    decodes_here = info.capabilities.local_timing
    return 0.2 if decodes_here and info.where == "cpu" else 0.1


def paced_interval(interval_s: float, active_runs: int) -> float:
    """One run's seconds between page updates when active_runs run at once: the server's pages
    together get at most RUNS_PER_INTERVAL / interval_s updates a second (20 on a CPU), however
    many people watch, and rendering them does not grow into the time the engine decodes in.
    (8 users on 2 cores, the clients on the same machine: the page's aggregate rate was 63% of
    the engine's at 5 updates a second per run, 66% paced, 76% at one update every 2 s.)"""
    return interval_s * max(1.0, active_runs / RUNS_PER_INTERVAL)


class EventPump:
    """Runs the engine's event generator on its own thread, so the engine keeps decoding while
    the page's previous update is serialized and sent; the handler takes events in batches."""

    _END = object()

    def __init__(self, events: Iterator, cancel: threading.Event):
        self._queue: queue.Queue = queue.Queue()
        self._ended = threading.Event()  # set once the last item (_END) is queued
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
            self._ended.set()

    def batches(self, interval: Callable[[], float]) -> Iterator[list]:
        """Lists of events, one list at most every interval() seconds (asked before each list);
        ends after the last event. While the run is queued, an empty list each interval: its
        page shows the wait growing. The run's first token goes out at once, in a list of its own
        making: the time to first token the page shows is the engine's, not a page interval more."""
        waiting, first_token = False, True
        while True:
            interval_s = interval()
            try:
                batch = [self._queue.get(timeout=interval_s if waiting else None)]
            except queue.Empty:
                yield []
                continue
            deadline = time.perf_counter() + interval_s
            while (batch[-1] is not self._END and not (first_token and isinstance(batch[-1], StepEvent))
                   and (left := deadline - time.perf_counter()) > 0):
                try:
                    batch.append(self._queue.get(timeout=left) if first_token else self._queue.get_nowait())
                except queue.Empty:
                    if first_token:
                        break
                    # After the first token, one wait to the interval's end (or the run's), then
                    # all that came: waking at each event took the GIL from the engine's thread
                    # as it handed out a step's tokens (8 runs: 8 wakings a step).
                    self._ended.wait(left)
                    batch += self._drain()
                    break
            done = batch[-1] is self._END
            events = [e for e in batch if e is not self._END]
            first_token = first_token and not any(isinstance(e, StepEvent) for e in events)
            waiting = bool(events) and isinstance(events[-1], WaitEvent)
            for i, e in enumerate(events):
                if isinstance(e, BaseException):  # the events before it are delivered first
                    if i:
                        yield events[:i]
                    if isinstance(e, TokenLabError):
                        raise gr.Error(page_message(e, one_line=True), print_exception=False)
                    raise e
            yield events
            if done:
                return

    def _drain(self) -> list:
        """Every item queued now, up to and with _END."""
        items = []
        while not items or items[-1] is not self._END:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def close(self) -> None:
        """Stop the engine (if it still runs) and wait for its thread: the KV cache is freed."""
        self._cancel.set()
        self._thread.join()
