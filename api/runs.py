"""A request's completions run on the engine beside everyone else's runs (the page's too: one
scheduler batches them all), their events handed to the web server's event loop as they come.

Each completion is one engine run on its own thread (the engine's generate is a blocking
iterator). Leaving `events` early (a client that disconnects, an error) cancels every run of the
request: each ends within one step and gives its KV blocks back.
"""

from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator

from inference.events import BeamDoneEvent, DoneEvent, StepEvent
from inference.request import RunRequest

ENDS = (DoneEvent, BeamDoneEvent)  # a run's last event: a sampled run's, a beam search's


class Runs:
    """Runs of one request: jobs[i] a RunRequest (inference.request.prepare_run, every one
    prepared before the request is answered), each with its cancel flag."""

    def __init__(self, engine, jobs: list[RunRequest], cancels: list[threading.Event]):
        self.engine, self.jobs, self.cancels = engine, jobs, cancels
        self._threads: list[threading.Thread] = []

    async def events(self) -> AsyncIterator[tuple[int, StepEvent | DoneEvent | BeamDoneEvent]]:
        """(job index, StepEvent, or its end: DoneEvent or BeamDoneEvent) as they come, until
        every job is done. An engine's error (a setting it refuses, a server that fails) is
        raised here."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        for i in range(len(self.jobs)):
            t = threading.Thread(target=self._drive, args=(i, loop, queue), daemon=True,
                                 name="tokenlab-api-run")
            self._threads.append(t)
            t.start()
        remaining = len(self.jobs)
        try:
            while remaining:
                i, ev = await queue.get()
                if isinstance(ev, BaseException):
                    raise ev
                if isinstance(ev, ENDS):
                    remaining -= 1
                yield i, ev
        finally:
            self.cancel()

    def cancel(self) -> None:
        for c in self.cancels:
            c.set()

    def _drive(self, i: int, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (i, item))
            except RuntimeError:  # the event loop is closed: the server is stopping
                self.cancels[i].set()

        events = None
        try:
            events = self.engine.run(self.jobs[i], self.cancels[i])
            for ev in events:
                if isinstance(ev, (StepEvent, *ENDS)):
                    put(ev)
        except Exception as e:  # handed to the request, which answers with it
            put(e)
        finally:
            if events is not None:
                events.close()  # a run left early is abandoned, its blocks given back
