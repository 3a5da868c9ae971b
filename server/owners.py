"""Whose a session is. A browser tab (or a gradio_client) names its session by a hash it makes
itself (gradio's page: 11 characters of Math.random), and every event, stream and cancel carries
it; that hash alone would be a key anyone who learns or guesses it could use. So each session is
bound, at its first use, to the visitor who used it:

- with logins (--auth), their login (gradio's access-token cookie);
- without, a random 128-bit cookie (VISITOR_COOKIE, HttpOnly) the server sets on its first answer
  to a browser or client that has none; gradio_client keeps the cookies of the page's config;
- a client that sends neither is "anonymous": its sessions are open to other anonymous clients
  only, never to a visitor with a cookie or a login, nor theirs to it.

A request naming a session bound to someone else is refused (server.guard.RouteGuard, 403):
its events (runs, the branch tree, the look inside a step), its stream of messages, its heartbeat
and its cancels. A binding goes with the session's state (SessionKeeper.forget), and one whose
session never had any is dropped once idle (prune), so what is kept is bounded by the sessions
in use, not by every visitor there ever was.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from typing import Callable

VISITOR_COOKIE = "tokenlab-visitor"
_VISITOR = re.compile(r"[0-9a-f]{32}")  # secrets.token_hex(16): 128 random bits
IDLE_S = 15 * 60  # a binding whose session holds no state and that no request named for this long goes
MAX_BOUND = 100_000  # the most bindings kept; beyond it the oldest of those with no state go first


def login_of(scope) -> str | None:
    """The login of a request to a gradio app with logins (its access-token cookie), else None."""
    app = scope.get("app")
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if not tokens or not cookie_id:
        return None
    cookies = _cookies(scope)
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return tokens.get(token) if token else None


def visitor_cookie(scope) -> str | None:
    """The request's visitor cookie, if it carries a well-formed one."""
    value = _cookies(scope).get(VISITOR_COOKIE)
    return value if value is not None and _VISITOR.fullmatch(value) else None


def owner_of(scope) -> str | None:
    """Who a request is, as a session's binding names them: "user NAME", "visitor COOKIE", or
    None (anonymous)."""
    login = login_of(scope)
    if login:
        return f"user {login}"
    cookie = visitor_cookie(scope)
    return f"visitor {cookie}" if cookie else None


def new_visitor_cookie() -> bytes:
    """A Set-Cookie header's value: a fresh 128-bit visitor key, for this site, never sent to scripts."""
    return f"{VISITOR_COOKIE}={secrets.token_hex(16)}; Path=/; HttpOnly; SameSite=Lax".encode()


def _cookies(scope) -> dict[str, str]:
    from starlette.requests import HTTPConnection
    return HTTPConnection(scope).cookies


class Owners:
    """Each session's owner (owner_of's value), bound at its first use."""

    def __init__(self, idle_s: float = IDLE_S, cap: int = MAX_BOUND, clock=time.monotonic):
        self.idle_s, self.cap, self.clock = idle_s, cap, clock
        self._owner: OrderedDict[str, tuple[str | None, float]] = OrderedDict()  # by last use
        self._lock = threading.Lock()

    def claim(self, session: str, owner: str | None) -> bool:
        """Whether `owner` may use `session`: it is theirs, or nobody's yet (it becomes theirs)."""
        now = self.clock()
        with self._lock:
            held = self._owner.get(session)
            if held is not None and held[0] != owner:
                return False
            self._owner[session] = (owner, now)
            self._owner.move_to_end(session)
            while len(self._owner) > self.cap:
                self._owner.popitem(last=False)
            return True

    def owner(self, session: str) -> str | None:
        with self._lock:
            held = self._owner.get(session)
        return held[0] if held is not None else None

    def forget(self, session: str) -> None:
        """The session's state was deleted: its binding goes with it."""
        with self._lock:
            self._owner.pop(session, None)

    def prune(self, live: Callable[[str], bool]) -> None:
        """Bindings idle for idle_s whose session is not `live` (holds no state, no open tab) go."""
        now = self.clock()
        with self._lock:
            for session, (_, seen) in list(self._owner.items()):
                if now - seen <= self.idle_s:
                    break  # the rest were used later
                if not live(session):
                    del self._owner[session]

    def __len__(self) -> int:
        with self._lock:
            return len(self._owner)
