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

import asyncio
import json
import re
import threading
import time
from collections import OrderedDict
from typing import Protocol

from inference.errors import lone_surrogate
from server.limits import sessions_message
from server.owners import Owners, login_of, new_visitor_cookie, owner_of, visitor_cookie

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
    session beyond the client's share answer 429, one that names another visitor's session 403
    (server/owners.py); a gradio body that names no event of the page, nests too deep or holds a
    lone surrogate 400, naming what is wrong. With logins, what describes the API (the page's copy
    of it before login, /openapi.json) and cancelling need a login."""

    def __init__(self, app, sessions: Sessions | None = None, max_body: int = MAX_BODY_BYTES,
                 beside: tuple[Beside, ...] = (), owners: Owners | None = None, events: Events | None = None,
                 logins: bool = False):
        self.app, self.sessions, self.max_body = app, sessions or Sessions(None), max_body
        self.beside = tuple(beside)
        self.owners = owners if owners is not None else Owners()  # (an empty one is falsy: it has a length)
        self.events, self.logins = events, logins

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if not served(path):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _reply(send, 404, "Not served by this page.", path, self.beside)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        owner = owner_of(scope)
        if self.logins and owner is None and _LOGIN_FIRST.fullmatch(path):
            return await _reply(send, 401, "Log in first.", path, self.beside)
        session = _session_in_url(scope)
        if session is not None and not self.owners.claim(session, owner):
            return await _reply(send, 403, NOT_YOURS, path, self.beside)
        if scope.get("method") == "GET" and session is None and not any(b.paths.fullmatch(path) for b in self.beside):
            # The page and its config: what a browser or gradio_client reads before naming a
            # session. (A script that names one first stays anonymous: a cookie it would take
            # from that answer would make its next request another visitor's.)
            send = _with_visitor_cookie(scope, send)
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            if self.logins and owner is None and path in PAGES:  # the login form only
                send = _without_api_info(send)
            if session is not None and path.rstrip("/") == "/gradio_api/queue/data" and self.events is not None:
                if not self.events.streams(session):  # (gradio's own 404 comes mid-stream, with a traceback)
                    return await _reply(send, 404, "No such session: join the queue first.", path, self.beside)
                return await _watching(self.app, scope, receive, send, lambda: self.events.gone(session))
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _reply(send, 413, f"Request too large: this page accepts at most "
                                           f"{self.max_body // (1024 * 1024)} MiB.", path, self.beside)
        if not _EVENT_ROUTES.fullmatch(path):
            return await self.app(scope, _counted(receive, self.max_body), send)
        # Read the body (at most max_body) to see which session and event it names, then hand it on.
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
        refusal = self._refusal(scope, body, owner)
        if refusal is not None:
            return await _reply(send, *refusal, path, self.beside)
        fn, session = _one_key(body, _FN_KEY, _FN), _one_key(body, _SESSION_KEY, _SESSION)
        if self.events is not None and session:  # the caller's own (checked above)
            if path.rstrip("/") == "/gradio_api/cancel":
                if isinstance(fn, int):
                    self.events.cancelled(session.decode("ascii", "replace"), fn)
            elif path.rstrip("/") in ("/gradio_api/queue/join", "/gradio_api/run/predict"):
                self.events.joined(session.decode("ascii", "replace"))
        sent = False

        async def replay():
            nonlocal sent, body
            if not sent:
                sent = True
                out, body = body, b""
                return {"type": "http.request", "body": out, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _refusal(self, scope, body: bytes, owner: str | None) -> tuple[int, str] | None:
        """(status, message) for a gradio event's body that must not reach gradio, else None."""
        parsed = None
        if body.count(b"[") + body.count(b"{") > SHALLOW:  # only a body with many may nest deep
            try:
                parsed = json.loads(body)
            except RecursionError:
                return 400, "The request body nests too deep: JSON of at most a few hundred levels is read."
            except ValueError:
                return None  # not JSON: gradio says so
        fn = _one_key(body, _FN_KEY, _FN)
        if fn is False:
            return 400, "A request names one event, by its fn_index."
        if fn is not None and self.events is not None and fn not in self.events.indices():
            return 400, f"This page has no event {fn} (fn_index)."
        if _ESCAPED_SURROGATE.search(body):
            if parsed is None:
                try:
                    parsed = json.loads(body)
                except ValueError:
                    return None
            found = lone_surrogate(parsed)
            if found is not None:
                where = found[0]
                name = self.events.input_name(fn, where) if self.events is not None and fn is not None else None
                return 400, (f"{where}{f' ({name})' if name else ''} holds a lone surrogate: text must be valid "
                             "Unicode, where surrogates come in pairs.")
        # The session the body names: its one "session_hash" key (inside JSON strings quotes are
        # escaped, so the bare key appears only as a key; gradio's clients send it last).
        session = _one_key(body, _SESSION_KEY, _SESSION)
        if session is False:
            return 400, "A request names one session, by a short string."
        if session is not None:
            session = session.decode("ascii", "replace")
            if not self.owners.claim(session, owner):
                return 403, NOT_YOURS
            if self.sessions.cap is not None and not self.sessions.admit(_scope_client(scope), session):
                return 429, sessions_message(self.sessions.cap, self.sessions.idle_s)
        return None


class Events(Protocol):
    """The page's events, as the route guard checks a body against them, and what ends them."""

    def indices(self) -> set: ...

    def input_name(self, fn_index: int, where: str) -> str | None: ...

    def cancelled(self, session: str, fn_index: int) -> None:
        """The session's client cancelled its event fn_index (gradio's /cancel)."""

    def gone(self, session: str) -> None:
        """The session's stream of messages was cut before it ended (its client went away)."""

    def joined(self, session: str) -> None:
        """The session asked for an event (gradio's queue/join)."""

    def streams(self, session: str) -> bool:
        """Whether gradio has a stream of messages for the session (it joined the queue)."""


async def _watching(app, scope, receive, send, gone) -> None:
    """app(scope, receive, send) for a stream of messages, calling gone() the moment its client
    disconnects before the stream's end: gradio itself notices only when it next has a message
    to send or after 10 s, and a job that returns once (a beam search) sends none until its end."""
    inbox: asyncio.Queue = asyncio.Queue()
    ended = False

    async def watch():
        while True:
            message = await receive()
            await inbox.put(message)
            if message["type"] == "http.disconnect":  # (also what receive says once the answer is complete)
                if not ended:
                    gone()
                return

    async def sending(message):
        nonlocal ended
        if message["type"] == "http.response.body" and not message.get("more_body"):
            ended = True
        await send(message)

    task = asyncio.ensure_future(watch())
    try:
        await app(scope, inbox.get, sending)
    finally:
        ended = True
        task.cancel()


NOT_YOURS = "This session belongs to another visitor."
PAGES = ("/", "/gradio_api/", "/index.html")  # gradio's page, which embeds its API's description
# With logins, these need one (gradio checks its own routes but these): cancelling an event, a
# session's heartbeat (whose end stops its run), and the API's description.
_LOGIN_FIRST = re.compile(r"/gradio_api/(cancel|heartbeat/[^/]+)/?|/openapi\.json|/docs|/redoc")
# The gradio routes whose JSON body names an event and a session.
_EVENT_ROUTES = re.compile(r"/gradio_api/(queue/join|run/predict|cancel|reset|call/(v2/)?[^/]+)/?")
SHALLOW = 256  # a body with fewer brackets than this cannot nest past Python's parser
_FN_KEY = b'"fn_index"'
_FN = re.compile(rb'"fn_index"\s*:\s*(?:(-?\d{1,18})|null)')
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.S)


def _one_key(body: bytes, key: bytes, pattern: re.Pattern):
    """The value of the body's one `key` (bytes, or an int for fn_index), None if absent or
    null, False if the key comes twice or holds something else."""
    at = body.rfind(key)
    if at < 0:
        return None
    m = pattern.match(body, at)
    if body.find(key, 0, at) >= 0 or m is None:
        return False
    value = m.group(1)
    if value is None:
        return None
    return int(value) if pattern is _FN else value


def _session_in_url(scope) -> str | None:
    """The session a GET names: a heartbeat's path, or the queue's stream's query."""
    path = scope.get("path", "")
    if path.startswith("/gradio_api/heartbeat/"):
        return path.removeprefix("/gradio_api/heartbeat/").rstrip("/") or None
    if path.rstrip("/") == "/gradio_api/queue/data":
        from urllib.parse import parse_qs
        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash")
        return values[0] if values else None
    return None


def _with_visitor_cookie(scope, send):
    """send() that gives a request without a visitor cookie one (server/owners.py)."""
    if visitor_cookie(scope) is not None:
        return send

    async def cookie_send(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", new_visitor_cookie())]}
        await send(message)
    return cookie_send


def _without_api_info(send):
    """send() for gradio's page before login: its embedded description of the API left out
    (the login form needs none of it)."""
    start, parts = None, []

    async def stripped(message):
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
            return
        if message["type"] != "http.response.body":
            return await send(message)
        parts.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = _API_INFO.sub(b"window.gradio_api_info = null;</script>", b"".join(parts))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return stripped


def visitor_openapi(app) -> dict:
    """The app's OpenAPI description with only the paths a visitor may call (served()): it is
    what /openapi.json answers (needing a login where there are logins)."""
    schema = app.openapi()
    paths = {p: v for p, v in schema.get("paths", {}).items() if served(re.sub(r"\{[^}]*\}", "x", p))}
    return {**schema, "paths": paths}


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
    user = login_of(scope)
    if user:
        return f"user {user}"
    client = scope.get("client")
    return f"address {client[0]}" if client else "local"
