"""What a visitor can reach: the routes served, the size of a request, the sessions a client holds.

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

import json
import re
import threading
import time
from collections import OrderedDict
from typing import Protocol

from server.limits import sessions_message

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


class Beside(Protocol):
    """A service mounted beside the page on its server (the OpenAI-compatible API, api/routes.py):
    the paths it serves, and the body of a refusal there in its own words."""
    paths: re.Pattern

    def refusal(self, status: int, message: str) -> dict: ...

    def mount(self, app) -> None: ...


async def _reply(send, status: int, message: str, path: str = "", beside: tuple[Beside, ...] = ()) -> None:
    """A refusal as JSON: in the words of the service whose path it is, else the page's."""
    owner = next((b for b in beside if b.paths.fullmatch(path)), None)
    body = json.dumps(owner.refusal(status, message) if owner is not None
                      else {"detail": message, "error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class RouteGuard:
    """ASGI middleware in front of gradio's app: routes the page does not serve answer 404 and
    bodies over MAX_BODY_BYTES 413, both before the body is read; requests that name a new
    session beyond the client's share answer 429."""

    def __init__(self, app, sessions: Sessions | None = None, max_body: int = MAX_BODY_BYTES,
                 beside: tuple[Beside, ...] = ()):
        self.app, self.sessions, self.max_body = app, sessions or Sessions(None), max_body
        self.beside = tuple(beside)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if not served(path):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _reply(send, 404, "Not served by this page.", path, self.beside)
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _reply(send, 413, f"Request too large: this page accepts at most "
                                           f"{self.max_body // (1024 * 1024)} MiB.", path, self.beside)
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
                                               f"{self.max_body // (1024 * 1024)} MiB.", path, self.beside)
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
                return await _reply(send, 400, "A request names one session, by a short string.", path,
                                    self.beside)
            session = m.group(1)
            if session is not None and not self.sessions.admit(_scope_client(scope), session.decode("ascii", "replace")):
                return await _reply(send, 429, sessions_message(self.sessions.cap, self.sessions.idle_s),
                                    path, self.beside)
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
