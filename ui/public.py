"""What a visitor can reach, and what one visitor can cost: the limits of a shared page.

- Routes: the page serves its own routes only. Gradio's upload, file, proxy and media routes
  (and the rest this page never calls) answer 404 before a byte of the body is read, so nothing
  can be stored on or fetched from the server (RouteGuard).
- Request size: a body over MAX_BODY_BYTES is refused (413) before it is read; text inside a
  smaller one is checked against the context window before any tokenizing (the engine).
- Fair shares: one engine job (a run, a comparison, a score, a look inside or a replay) per
  browser session, at most `runs_per_client` jobs queued or running per client, at most
  `sessions_per_client` sessions per client, at most `max_new_tokens` new tokens a run and
  `max_samples` samples at once (Limits; the queue's Admission and the handlers enforce them,
  and say so on the page).

A client is the visitor's login with --auth, else their IP address. Behind a proxy on this
machine (the --share tunnel's client connects from 127.0.0.1), uvicorn takes the address from
the proxy's X-Forwarded-For; a proxy that sends none makes every visitor one client.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from types import SimpleNamespace

ENGINE = "engine"  # the concurrency id of every event that runs the model
# Picking a model: not an engine job (a run clicked while its model loads waits for the load,
# never refused as a second job); loads are one at a time (Models) and once per model.
MODEL_PICK = "model-pick"

RUN_GOING = "You already have a run going: wait for it to finish, or press Stop."


def runs_message(n: int, cap: int) -> str:
    return (f"You already have {n} run{'s' if n != 1 else ''} going or waiting (from other tabs or "
            f"scripts); the server allows {cap} at a time per visitor. Wait for one to finish.")


def sessions_message(cap: int, idle_s: float) -> str:
    return (f"You have {cap} sessions open; the server allows {cap} per visitor. Close a tab, or "
            f"wait {max(1, round(idle_s / 60))} minutes for an idle one to expire.")


def samples_message(cap: int, asked) -> str:
    return f"The server allows at most {cap} samples at once; got {asked}."


class Refused(Exception):
    """A limit said no; the message is shown as is."""


@dataclass(frozen=True)
class Limits:
    """None means no limit. Limits() is the local playground; Limits.shared() a public link."""
    max_new_tokens: int | None = None  # a run's max new tokens, at most
    runs_per_client: int | None = None  # engine jobs queued or running per client
    sessions_per_client: int | None = None  # sessions a client holds (idle ones expire)
    session_capacity: int | None = None  # sessions the server keeps state for, all clients
    max_samples: int | None = None  # samples drawn at once by "Many samples" (at most samples.MAX_SAMPLES)

    @classmethod
    def shared(cls, **overrides) -> "Limits":
        """The defaults of a --share page; overrides of None keep the default, 0 means no limit."""
        base = cls(max_new_tokens=512, runs_per_client=1, sessions_per_client=8, session_capacity=256,
                   max_samples=16)
        values = {k: v for k, v in overrides.items() if v is not None}
        return replace(base, **{k: (None if v == 0 else v) for k, v in values.items()})

    @classmethod
    def local(cls, **overrides) -> "Limits":
        return replace(cls(), **{k: (None if v == 0 else v) for k, v in overrides.items() if v is not None})

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.max_new_tokens, self.runs_per_client, self.sessions_per_client,
                                           self.max_samples))


def client_key(request) -> str:
    """The visitor: their login (with --auth), else their address. Takes a gr.Request, a
    gradio queue Event or a Starlette request."""
    user = getattr(request, "username", None)
    if user:
        return f"user {user}"
    client = getattr(request, "client", None)
    if client is None:  # a queue Event holds the fastapi request
        client = getattr(getattr(request, "request", None), "client", None)
    host = getattr(client, "host", None)
    return f"address {host}" if host else "local"


# ------------------------------------------------------------------ admission to the queue

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


# ------------------------------------------------------------------ the routes

MAX_BODY_BYTES = 16 * 1024 * 1024  # the largest request the page accepts
SESSION_IDLE_S = 15 * 60  # a session no request has named for this long no longer counts

# The gradio routes this page uses (the browser page, gradio_client, the REST API of
# /generate, /compare and /stop, and the login); under /gradio_api nothing else is served.
_SERVED = re.compile(
    r"/gradio_api/(queue/(join|data)|heartbeat/[^/]+|run/predict|startup-events|info|openapi\.json"
    r"|call/(v2/)?[^/]+(/[^/]+)?|cancel|reset|login_check|user|token|app_id|theme\.css)/?")
_SESSION_KEY = b'"session_hash"'
_SESSION = re.compile(rb'"session_hash"\s*:\s*(?:"([^"\\]{1,100})"|null)')


def served(path: str) -> bool:
    """Whether the page serves this path: its own routes, and gradio's page and assets outside
    /gradio_api. Uploads, files, proxies, media streams, recordings, component servers, run
    history and the monitoring dashboard are not served."""
    if path.startswith("/monitoring"):  # gradio's analytics dashboard: off, and closed
        return False
    if not path.startswith("/gradio_api"):
        return True
    return _SERVED.fullmatch(path) is not None


class Sessions:
    """Each client's sessions, by last use; idle ones expire after SESSION_IDLE_S."""

    def __init__(self, cap: int | None, idle_s: float = SESSION_IDLE_S, clock=time.monotonic):
        self.cap, self.idle_s, self.clock = cap, idle_s, clock
        self._by_client: dict[str, OrderedDict[str, float]] = {}
        self._lock = threading.Lock()

    def admit(self, client: str, session: str) -> bool:
        """Note that `client` uses `session`; False if that would be one session too many."""
        if self.cap is None:
            return True
        now = self.clock()
        with self._lock:
            held = self._by_client.setdefault(client, OrderedDict())
            for s, seen in list(held.items()):
                if now - seen > self.idle_s:
                    del held[s]
            if session not in held and len(held) >= self.cap:
                return False
            held[session] = now
            held.move_to_end(session)
            return True

    def forget(self, session: str) -> None:
        """A closed tab's session no longer counts."""
        with self._lock:
            for client, held in list(self._by_client.items()):
                held.pop(session, None)
                if not held:
                    del self._by_client[client]

    def prune(self) -> None:
        """Idle sessions, and clients left with none, are let go of: what is kept is bounded by
        the sessions in use, not by every visitor there ever was."""
        now = self.clock()
        with self._lock:
            for client, held in list(self._by_client.items()):
                for s, seen in list(held.items()):
                    if now - seen > self.idle_s:
                        del held[s]
                if not held:
                    del self._by_client[client]

    def count(self, client: str) -> int:
        with self._lock:
            return len(self._by_client.get(client, ()))


# Paths of the OpenAI-compatible API (api/routes.py): their refusals are OpenAI's error bodies.
API_PATHS = re.compile(r"/v1/.*|/(tokenize|detokenize|tokenizer_info)/?")


async def _reply(send, status: int, message: str, path: str = "") -> None:
    import json
    if API_PATHS.fullmatch(path):
        from api.errors import error_body
        code = {404: "not_found", 413: "request_too_large", 429: "rate_limit_exceeded"}.get(status)
        body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
    else:
        body = json.dumps({"detail": message, "error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class RouteGuard:
    """ASGI middleware in front of gradio's app: routes the page does not serve answer 404 and
    bodies over MAX_BODY_BYTES 413, both before the body is read; requests that name a new
    session beyond the client's share answer 429."""

    def __init__(self, app, sessions: Sessions | None = None, max_body: int = MAX_BODY_BYTES):
        self.app, self.sessions, self.max_body = app, sessions or Sessions(None), max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if not served(path):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _reply(send, 404, "Not served by this page.")
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _reply(send, 413, f"Request too large: this page accepts at most "
                                           f"{self.max_body // (1024 * 1024)} MiB.", path)
        if self.sessions.cap is None:
            return await self.app(scope, _counted(receive, self.max_body), send)
        # Read the body (at most max_body) to see which session it names, then hand it on.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            size += len(message.get("body", b""))
            if size > self.max_body:
                return await _reply(send, 413, f"Request too large: this page accepts at most "
                                               f"{self.max_body // (1024 * 1024)} MiB.", path)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)  # the app takes this one copy
        del chunks
        # The session the body names: its one "session_hash" key (inside JSON strings quotes are
        # escaped, so the bare key appears only as a key; gradio's clients send it last).
        at = body.rfind(_SESSION_KEY)
        if at >= 0:
            m = _SESSION.match(body, at)
            if body.find(_SESSION_KEY, 0, at) >= 0 or m is None:
                return await _reply(send, 400, "A request names one session, by a short string.")
            session = m.group(1)
            if session is not None and not self.sessions.admit(_scope_client(scope), session.decode("ascii", "replace")):
                return await _reply(send, 429, sessions_message(self.sessions.cap, self.sessions.idle_s))
        sent = False

        async def replay():
            nonlocal sent, body
            if not sent:
                sent = True
                out, body = body, b""
                return {"type": "http.request", "body": out, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _counted(receive, limit: int):
    """receive() that ends the request as a disconnect once more than `limit` bytes arrived
    (a body sent in chunks, with no Content-Length)."""
    size = 0

    async def counted():
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                return {"type": "http.disconnect"}
        return message

    return counted


def _scope_client(scope) -> str:
    """client_key for a raw request: gradio's login cookie names the user, else the address."""
    app = scope.get("app")
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if tokens and cookie_id:
        from starlette.requests import HTTPConnection
        cookies = HTTPConnection(scope).cookies
        token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
        user = tokens.get(token)
        if user:
            return f"user {user}"
    client = scope.get("client")
    return f"address {client[0]}" if client else "local"
