"""Each browser session's state on the server, kept while its page can still use it.

Gradio keeps a session's state (its gr.State values, the run record and the conversation, and
its own copy of every component's configuration and last value, about 170 KiB before any run)
until more than `state_session_capacity` sessions exist; a closed tab's gr.State values expire
an hour later and the rest only by that capacity. Here a session's whole state is deleted:

- CLOSED_GRACE_S after its tab closed (its heartbeat stream ended and the page's unload ran),
  unless it was used again meanwhile (a tab that lost its connection for a moment keeps its run);
- IDLE_S after its last event if it never held a heartbeat (raw API clients);

never while it has a job running or an event in the queue. Its unread messages and the page's
own entries of it (a click still waiting) go with it. The sessions kept are capped from the
memory available at launch (session_capacity), in every launch mode; beyond the cap Gradio
drops the least recently used one.

The sweep runs on the server's event loop, where Gradio itself reads and writes the sessions.
"""

from __future__ import annotations

import asyncio
import ctypes
import re
import threading
import time

from server.guard import SESSION_IDLE_S

CLOSED_GRACE_S = 60.0  # a closed tab's state is kept this long: a reconnecting tab finds its run
IDLE_S = SESSION_IDLE_S  # a session with no heartbeat and no event for this long is deleted
SWEEP_S = 5.0  # how often the sweep runs
# What one session's state may take: ~170 KiB of Gradio's own copies, ~2 KiB a token of its run
# (its steps and the output with its popovers), a replay's logits (vocabulary × 4 bytes). A
# 512-token run with a replay is about 1.5 MiB.
SESSION_BYTES = 2 * 1024 * 1024
MEMORY_SHARE = 8  # the sessions kept take at most this fraction (1/8) of the memory available
MAX_SESSIONS = 10_000  # Gradio's own default capacity, the most kept however much memory there is
MIN_SESSIONS = 64  # the least kept, however little memory there is

# Deleted sessions' objects are freed, but glibc keeps the freed pages for later allocations,
# among live ones in each thread's arena. After a sweep that deleted sessions, and at most this
# often, malloc_trim gives every arena's free pages back to the system.
TRIM_S = 60.0

# Gradio marks a cancelled event (app.iterators_to_reset) so that, if the event's next iteration
# comes after the cancel, it does not resume the closed iterator; the mark is removed only by
# that iteration, which a cancelled event mostly never has: one mark per stopped run, for ever.
# A mark is dropped once it is this old (real time), far beyond that race's window.
RESET_MARK_S = 120.0

_HEARTBEAT = re.compile(r"/gradio_api/heartbeat/([^/]{1,100})/?")


def session_capacity(limit: int | None, available_bytes: int) -> int:
    """Sessions kept at once: `limit` (a shared page's, if any) or MAX_SESSIONS, and at most as
    many as SESSION_BYTES each fit in 1/MEMORY_SHARE of the memory available (but MIN_SESSIONS)."""
    by_memory = max(MIN_SESSIONS, available_bytes // MEMORY_SHARE // SESSION_BYTES)
    return int(min(limit or MAX_SESSIONS, by_memory))


def heap_trimmer():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class SessionKeeper:
    """Deletes the state of sessions whose tab is gone (module docstring). attach() connects it
    to a launched app; until then closed() records nothing and sweep() deletes nothing."""

    def __init__(self, registry, sessions=None, forget=None, grace_s: float = CLOSED_GRACE_S,
                 idle_s: float = IDLE_S, clock=time.time, owners=None):
        """registry: the RunRegistry (a session with a job is kept); sessions: server.guard's
        Sessions of each client, pruned at each sweep; forget(session): called for each session
        deleted, so that the page's own entries of it go with it; owners: server.owners' Owners,
        whose binding of a session goes with its state (and one with no state once idle)."""
        self.registry, self.sessions, self.forget, self.owners = registry, sessions, forget, owners
        self.grace_s, self.idle_s, self.clock = grace_s, idle_s, clock
        self._closed: dict[str, float] = {}  # session -> when its tab closed (at most the sessions kept)
        self._live: dict[str, int] = {}  # session -> its open heartbeat streams
        self._lock = threading.Lock()
        self._app = self._loop = None
        self.deleted = 0  # sessions deleted so far
        self._marks: dict[str, float] = {}  # a reset mark -> when a sweep first saw it
        self.mark_clock = time.monotonic  # real time, whatever `clock` says
        self._trim, self._trimmed_at = heap_trimmer(), 0.0

    def attach(self, app) -> None:
        """Keep the sessions of a launched Gradio app (its state holder and queue)."""
        self._app = app

    @property
    def attached(self) -> bool:
        return self._app is not None

    def kept(self) -> int:
        """Sessions whose state the server keeps now."""
        return len(self._app.state_holder.session_data) if self._app is not None else 0

    def state_of(self, session: str):
        """Gradio's state of the session (its SessionState), or None if none is kept."""
        return self._app.state_holder.session_data.get(session) if self._app is not None else None

    def closing(self, session: str) -> bool:
        """Whether the session's tab has closed and its state waits out the grace period."""
        with self._lock:
            return session in self._closed

    # ---------------------------------------------------------------- what the page tells

    def connected(self, session: str) -> None:
        with self._lock:
            self._live[session] = self._live.get(session, 0) + 1
            self._closed.pop(session, None)

    def disconnected(self, session: str) -> None:
        with self._lock:
            n = self._live.pop(session, 1) - 1
            if n > 0:
                self._live[session] = n

    def closed(self, session: str) -> None:
        """The tab closed (the page's unload): its state goes after the grace period."""
        if self._app is not None:
            with self._lock:
                self._closed[session] = self.clock()

    # ---------------------------------------------------------------- the sweep

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sweep every SWEEP_S on the server's loop (called there, on its first request)."""
        if self._loop is None:
            self._loop = loop
            loop.call_later(SWEEP_S, self._tick)

    def _tick(self) -> None:
        try:
            self.sweep()
        finally:
            self._loop.call_later(SWEEP_S, self._tick)

    def sweep_now(self, timeout_s: float = 60) -> int:
        """Sweep once on the server's loop, from any thread; returns the sessions deleted."""
        if self._loop is None:
            return self.sweep()  # no request has come yet: the loop is idle
        return asyncio.run_coroutine_threadsafe(self._sweep_async(), self._loop).result(timeout_s)

    async def _sweep_async(self) -> int:
        return self.sweep()

    def sweep(self) -> int:
        """Delete the state of every session that expired; returns how many. On the loop."""
        if self._app is None:
            return 0
        holder, queue, now = self._app.state_holder, self._app.get_blocks()._queue, self.clock()
        gone = []
        with self._lock:
            for session in list(holder.session_data):
                if (session in self._live or self.registry.running(session)
                        or queue.pending_event_ids_session.get(session)):
                    continue
                used = holder.time_last_used.get(session)
                used = used.timestamp() if used is not None else now
                closed = self._closed.get(session)
                if closed is not None and used > closed + 1:  # used again since: a reconnected tab
                    del self._closed[session]
                    closed = None
                if (closed is not None and now - closed >= self.grace_s) or (
                        closed is None and now - used >= self.idle_s):
                    gone.append(session)
            for session in list(self._closed):  # a closed tab Gradio already let go of
                if session not in holder.session_data:
                    del self._closed[session]
        for session in gone:
            self._delete(session, holder, queue)
        self._drop_old_marks(self._app.iterators_to_reset)
        if self.sessions is not None:
            self.sessions.prune()
        if self.owners is not None:
            self.owners.prune(lambda s: s in holder.session_data or s in self._live)
        self.deleted += len(gone)
        if gone and self._trim is not None and now - self._trimmed_at >= TRIM_S:
            self._trim(0)
            self._trimmed_at = now
        return len(gone)

    def _drop_old_marks(self, marks: set) -> None:
        """Gradio's reset marks older than RESET_MARK_S go (see there)."""
        now = self.mark_clock()
        self._marks = {m: self._marks.get(m, now) for m in marks}
        for m, seen in list(self._marks.items()):
            if now - seen > RESET_MARK_S:
                marks.discard(m)
                del self._marks[m]

    def _delete(self, session: str, holder, queue) -> None:
        holder.delete_state(session)  # gr.State's delete_callback, as Gradio's own expiry calls it
        with holder.lock:
            holder.session_data.pop(session, None)
            holder.time_last_used.pop(session, None)
        # Its unread messages (a cancelled run's last updates) go; the queue itself stays, since
        # a stream still open would answer 404 without it (Gradio keeps at most 2,000, by LRU).
        messages = queue.pending_messages_per_session.get(session)
        while messages is not None and not messages.empty():
            messages.get_nowait()
        queue.pending_event_ids_session.pop(session, None)
        with self._lock:
            self._closed.pop(session, None)
        if self.forget is not None:
            self.forget(session)
        if self.owners is not None:
            self.owners.forget(session)


class HeartbeatWatch:
    """ASGI middleware: which sessions have a heartbeat stream open (a tab or a gradio_client
    that is still there), and the keeper's sweep started on the server's loop."""

    def __init__(self, app, keeper: SessionKeeper):
        self.app, self.keeper = app, keeper

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.keeper.start(asyncio.get_running_loop())
        m = _HEARTBEAT.fullmatch(scope.get("path", ""))
        if m is None:
            return await self.app(scope, receive, send)
        session = m.group(1)
        self.keeper.connected(session)
        try:
            await self.app(scope, receive, send)
        finally:
            self.keeper.disconnected(session)
