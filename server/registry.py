"""The run registry: each browser session's (and API request's) engine job while it runs, with
its cancel flag and its client, so that one visitor holds one job a session and their share."""

from __future__ import annotations

import threading

from server.limits import RUN_GOING, Refused, runs_message


class RunRegistry:
    """Each browser session's engine job while it runs (a run, a comparison, a score, a look
    inside, a replay): its cancel flag, which Stop and closed tabs set, and its client. One job
    per session: a second is refused, never queued behind the first or swapped for it."""

    def __init__(self):
        self._runs: dict[str, tuple[threading.Event, str]] = {}
        self._changed = threading.Condition()
        # Sessions whose client cancelled or left while their event's job had not registered yet
        # (gradio starts the event, then the handler its job): that job starts stopped.
        self._stopped: set[str] = set()

    def start(self, session: str, client: str = "local", per_client: int | None = None) -> threading.Event:
        """Register the session's job; Refused if it has one, or its client `per_client`."""
        with self._changed:
            if session in self._runs:
                raise Refused(RUN_GOING)
            n = self._count(client)
            if per_client is not None and n >= per_client:
                raise Refused(runs_message(n, per_client))
            event = threading.Event()
            if session in self._stopped:  # its event was cancelled, or its client left, as it started
                self._stopped.discard(session)
                event.set()
            self._runs[session] = (event, client)
        return event

    def stop(self, session: str, starting: bool = False) -> None:
        """Stop the session's job. starting: the client cancelled its event or left, whose job
        may not have registered yet: a job the session starts next starts stopped (until
        `resume`: the session's next event)."""
        with self._changed:
            run = self._runs.get(session)
            if run is None and starting:
                self._stopped.add(session)
        if run is not None:
            run[0].set()

    def resume(self, session: str) -> None:
        """The session asked for a new event: a stop meant for the one before no longer applies."""
        with self._changed:
            self._stopped.discard(session)

    def finish(self, session: str, event: threading.Event) -> None:
        with self._changed:
            if self._runs.get(session, (None,))[0] is event:
                del self._runs[session]
                self._changed.notify_all()

    def running(self, session: str) -> bool:
        with self._changed:
            return session in self._runs

    def count(self, client: str) -> int:
        with self._changed:
            return self._count(client)

    def _count(self, client: str) -> int:
        return sum(c == client for _, c in self._runs.values())

    def settle(self, session: str, timeout_s: float = 2.0) -> None:
        """If the session's job was stopped, wait (at most timeout_s) for it to end: it ends
        within one step, and a Generate right after Stop should not find it still going."""
        with self._changed:
            self._changed.wait_for(lambda: session not in self._runs or not self._runs[session][0].is_set(),
                                   timeout_s)

    def __len__(self) -> int:
        return len(self._runs)
