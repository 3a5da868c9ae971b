"""A small HTTP server on 127.0.0.1 for what a real vLLM server cannot be made to do on demand:
hang, refuse with a 503, break a stream, answer with something that is not JSON. It is not a
stand-in for vLLM: the tests of what vLLM returns run against vLLM (test_remote_vllm.py).

Each path answers as `routes` says: a (status, body) pair, or a callable taking the handler.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODELS = {"object": "list", "data": [{"id": "fake", "max_model_len": 64}]}


class FakeServer:
    def __init__(self, routes: dict):
        self.routes = routes
        self.release = threading.Event()  # set at the end: a hanging answer returns
        self.requests: list[tuple[str, dict | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                outer.requests.append((self.path, body))
                route = outer.routes.get(self.path)
                if route is None:
                    return self.send_json(404, {"detail": "Not Found"})
                if callable(route):
                    return route(self, body)
                status, payload = route
                self.send_json(status, payload)

            do_GET = do_POST = _answer

            def send_json(self, status: int, payload) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def start_stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()

            def event(self, payload) -> None:
                self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> "FakeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def chunk(token_id: int, text: str, logprob: float = -0.5, finish: str | None = None) -> dict:
    """One streamed completion chunk in vLLM's shape (one token, its own top-1)."""
    key = f"token_id:{token_id}"
    return {"choices": [{"index": 0, "text": text, "token_ids": [token_id], "finish_reason": finish,
                         "stop_reason": None,
                         "logprobs": {"tokens": [key], "token_logprobs": [logprob],
                                      "top_logprobs": [{key: logprob}]}}]}
