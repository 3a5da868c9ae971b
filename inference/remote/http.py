"""HTTP to a model server (vLLM's OpenAI-compatible API): JSON requests and a server-sent-event
stream, with every failure turned into a one-line ServerError. Only the standard library.

A stream can be aborted from another thread (Stop, a closed tab): shutting the socket down wakes
the reader at once, and the server sees the client go and aborts the request.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from urllib.parse import urlsplit

from inference.errors import (ContextTooLong, InputError, ModelNotServed, ServerError, ServerRefused,
                     ServerTimeout, ServerUnreachable)

# Phrases of vLLM's (and OpenAI's) error messages for a prompt that does not fit.
_CONTEXT_PHRASES = ("maximum context length", "max_model_len", "context length", "too long")
_MAX_MESSAGE = 300  # characters of a server's message shown in the one-line error


def one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


class ServerHTTP:
    """Requests to one server. `url` is the OpenAI API base (http://HOST:PORT/v1); vLLM serves
    /tokenize, /detokenize, /metrics and /health at the server's root, the base without /v1."""

    def __init__(self, url: str, timeout_s: float = 120.0):
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(f"--engine-url must look like http://HOST:PORT/v1, got {url!r}")
        try:
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise InputError(f"--engine-url has a bad port: {url!r}") from None
        if not timeout_s > 0:
            raise InputError(f"the server timeout must be a positive number of seconds, got {timeout_s!r}")
        self.url = url.strip().rstrip("/")
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.https, self.host = parts.scheme == "https", parts.hostname
        self.api = parts.path.rstrip("/")  # "/v1"
        self.root = self.api[:-3] if self.api.endswith("/v1") else self.api
        self.timeout_s = timeout_s

    # ------------------------------------------------------------ plain requests

    def get_json(self, path: str, root: bool = False, timeout_s: float | None = None):
        return _json(self.request("GET", path, None, root, timeout_s), self._where(path, root))

    def post_json(self, path: str, body: dict, root: bool = False, timeout_s: float | None = None):
        return _json(self.request("POST", path, body, root, timeout_s), self._where(path, root))

    def get_text(self, path: str, root: bool = False, timeout_s: float | None = None) -> str:
        return self.request("GET", path, None, root, timeout_s).decode("utf-8", errors="replace")

    def request(self, method: str, path: str, body: dict | None = None, root: bool = False,
                timeout_s: float | None = None) -> bytes:
        """The body of a 2xx answer; anything else raises a ServerError subclass."""
        conn = self._connect(timeout_s)
        try:
            resp = self._send(conn, method, path, body, root)
            data = self._read(resp.read, path, root)
            if resp.status >= 400:
                raise refusal(resp.status, data, self._where(path, root))
            return data
        finally:
            conn.close()

    # ------------------------------------------------------------ a stream

    def stream(self, path: str, body: dict) -> "EventStream":
        """POST with stream: true; the answer's events as dicts (see EventStream)."""
        conn = self._connect(None)
        try:
            resp = self._send(conn, "POST", path, body, False)
            if resp.status >= 400:
                raise refusal(resp.status, self._read(resp.read, path, False), self._where(path, False))
        except BaseException:
            conn.close()
            raise
        return EventStream(self, conn, resp, path)

    # ------------------------------------------------------------ plumbing

    def _where(self, path: str, root: bool) -> str:
        return f"{self.origin}{self.root if root else self.api}{path}"

    def _connect(self, timeout_s: float | None) -> http.client.HTTPConnection:
        timeout = timeout_s or self.timeout_s
        if self.https:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        conn.response_class = _Response
        return conn

    def _send(self, conn, method, path, body, root) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json, text/event-stream"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        target = (self.root if root else self.api) + path
        try:
            conn.request(method, target, body=data, headers=headers)
            return conn.getresponse()
        except (TimeoutError, socket.timeout):
            raise ServerTimeout(f"the model server at {self.url} did not answer within "
                                f"{conn.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as e:
            raise ServerUnreachable(f"cannot reach the model server at {self.url}: {_why(e)}") from None

    def _read(self, read, path, root) -> bytes:
        try:
            return read()
        except (TimeoutError, socket.timeout):
            raise ServerTimeout(f"the model server at {self.url} stopped answering "
                                f"({self._where(path, root)}) for {self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as e:
            raise ServerUnreachable(f"the connection to the model server at {self.url} broke: "
                                    f"{_why(e)}") from None


class _Response(http.client.HTTPResponse):
    """Keeps its socket: for an answer with "Connection: close" getresponse() drops the
    connection's, and EventStream.abort() must still be able to shut it down."""

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.sock = sock


class EventStream:
    """The data events of a server-sent-event answer, each a dict, until `data: [DONE]`.
    abort() may be called from any thread: iteration then ends quietly and `aborted` is set."""

    def __init__(self, http: ServerHTTP, conn, resp, path: str):
        self._http, self._conn, self._resp, self._path = http, conn, resp, path
        self._lock = threading.Lock()
        self.aborted = False

    def __iter__(self):
        try:
            while True:
                try:
                    line = self._resp.readline()
                except (TimeoutError, socket.timeout):
                    if self.aborted:
                        return
                    raise ServerTimeout(f"the model server at {self._http.url} sent nothing for "
                                        f"{self._http.timeout_s:g} s in the middle of an answer") from None
                except (OSError, ValueError, http.client.HTTPException) as e:
                    if self.aborted:
                        return
                    raise ServerUnreachable(f"the connection to the model server at "
                                            f"{self._http.url} broke mid-answer: {_why(e)}") from None
                if not line:
                    if self.aborted:
                        return
                    raise ServerUnreachable(f"the model server at {self._http.url} closed the "
                                            "connection before the end of its answer")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event names
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                event = _json(payload, self._http._where(self._path, False))
                if isinstance(event, dict) and "error" in event:
                    err = event["error"]
                    raise refusal(err.get("code") if isinstance(err, dict) else None,
                                  json.dumps(event).encode(), self._http._where(self._path, False))
                yield event
        finally:
            self.close()

    def abort(self) -> None:
        """Close the connection now (from any thread): the server aborts the request."""
        with self._lock:
            self.aborted = True
            sock = getattr(self._resp, "sock", None) or self._conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _why(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is the server running, on this address and port?)"
    if isinstance(e, socket.gaierror):
        return f"unknown host ({e.strerror or e})"
    return one_line(str(e) or type(e).__name__)


def _json(data: bytes, where: str):
    try:
        return json.loads(data)
    except ValueError:
        raise ServerError(f"{where} answered with something that is not JSON: "
                          f"{one_line(data.decode('utf-8', errors='replace'), 120)!r}") from None


def server_message(data: bytes) -> str:
    """The message of an error answer: OpenAI's {"error": {"message"}}, FastAPI's {"detail"},
    vLLM's {"message"}, or the text itself."""
    text = data.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        return one_line(text) or "(no message)"
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or body.get("detail")
        else:
            msg = err
        if isinstance(msg, list):  # FastAPI's validation errors
            msg = "; ".join(str(m.get("msg", m)) if isinstance(m, dict) else str(m) for m in msg)
        if msg:
            return one_line(msg)
    return one_line(text)


def refusal(status, data: bytes, where: str) -> ServerError:
    """The ServerError for an error answer (HTTP status, or a code in a streamed error)."""
    message = server_message(data)
    low = message.lower()
    status_text = f"HTTP {status}" if status else "error"
    if status == 404 and "model" in low:
        return ModelNotServed(f"the model server does not serve that model ({status_text}): {message}")
    if any(p in low for p in _CONTEXT_PHRASES):
        return ContextTooLong(f"the model server refused the request: {message}")
    if status == 404:
        return ServerRefused(f"{where} does not exist on the model server (HTTP 404); is "
                             "--engine-url the server's OpenAI API base, like http://HOST:PORT/v1?")
    return ServerRefused(f"the model server refused the request ({status_text}): {message}")
