"""Admission to the page's queue: who may start an engine job now (one a session, `runs_per_client`
a client), asked at the click, when the job joins gradio's queue, and when it starts."""

from __future__ import annotations

from types import SimpleNamespace

from server.limits import ENGINE, RUN_GOING, Limits, client_key, runs_message
from server.guard import Sessions

class Admission:
    """Who may start an engine job now. Asked at the click (the page's `begin`), when the job
    joins the queue (every client, scripts included), and when it starts (RunRegistry)."""

    def __init__(self, registry, limits: Limits):
        self.registry, self.limits = registry, limits
        self.sessions = Sessions(limits.sessions_per_client)  # RouteGuard counts them
        self._queued = lambda: []  # (session, client) of engine jobs waiting in the queue

    def refusal(self, session: str, client: str) -> str | None:
        queued = self._queued()
        if self.registry.running(session) or any(s == session for s, _ in queued):
            return RUN_GOING
        cap = self.limits.runs_per_client
        if cap is not None:
            n = self.registry.count(client) + sum(c == client for _, c in queued)
            if n >= cap:
                return runs_message(n, cap)
        return None

    def attach(self, demo) -> None:
        """Check every engine job as it joins gradio's queue. A refused job is taken out of the
        queue at once and ends with the refusal as its error, as a gr.Error would: the page
        shows it, gradio_client raises it."""
        queue = demo._queue

        def queued():
            q = queue.event_queue_per_concurrency_id.get(ENGINE)
            return [(e.session_hash, client_key(e)) for e in (q.queue if q else [])]

        self._queued = queued
        push = queue.push

        async def admitted_push(body, request, username):
            refusal = None
            fn = _fn_for(demo, body)
            if fn is not None and fn.concurrency_id == ENGINE and body.session_hash:
                who = SimpleNamespace(username=username, client=getattr(request, "client", None))
                refusal = self.refusal(body.session_hash, client_key(who))
            if refusal is not None and _unread(queue, body.session_hash) >= UNREAD_REFUSALS:
                # A client that does not read its refusals gets them as HTTP 400s: each
                # delivered as a job's error waits in memory until the client reads it.
                return False, refusal, "error"
            ok, event_id, state = await push(body=body, request=request, username=username)
            if ok and refusal is not None:
                _fail_at_once(queue, event_id, refusal)
            return ok, event_id, state

        queue.push = admitted_push


UNREAD_REFUSALS = 8


def _unread(queue, session: str) -> int:
    messages = queue.pending_messages_per_session.get(session)
    return messages.qsize() if messages is not None else 0


def _fn_for(demo, body):
    try:
        return demo.fns[body.fn_index] if body.fn_index is not None else None
    except (KeyError, IndexError, TypeError):
        return None


def _fail_at_once(queue, event_id: str, message: str) -> None:
    """End a job that has just joined the queue with `message` as its error. Runs with no await
    after the push, so the queue's loop cannot have started the job."""
    from gradio.exceptions import Error
    from gradio.server_messages import ProcessCompletedMessage
    from gradio.utils import error_payload

    event = queue.event_ids_to_events.pop(event_id, None)
    if event is None:
        return
    for q in queue.event_queue_per_concurrency_id.values():
        if event in q.queue:
            q.queue.remove(event)
    queue.send_message(event, ProcessCompletedMessage(
        output=error_payload(Error(message, print_exception=False), True), success=False))


