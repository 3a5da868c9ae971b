"""The requests of issue 59's findings, against a page with the API beside it, as a hostile visitor
sends them: values that crashed a request (lone surrogates, NaN and Infinity, tiny floats, bodies
and schemas nested deep, an event the page does not have, a stream of a session that never
joined), another visitor's session, a beam search that finishes nothing, a long prompt scored,
bad names; and runs of every kind cut mid-way (the client leaves, or cancels). bench/adversarial.py
runs them after its measurement and reports the server errors (5xx), the dropped connections and,
from the server's own count (CutWatch), the forward passes each cut run made after its cut before
its blocks were back.

    python -m bench.adversarial --random tiny --findings-only   # these alone
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_SCHEMA = '{"type":"object","properties":{"a":' * 2000 + '{"type":"string"}' + "}}" * 2000
CUT_TOKENS = 40  # a cut run's max new tokens (the bench page's cap)


def _api_requests() -> dict[str, tuple[str, str]]:
    """name -> (path, raw JSON body): the API's requests of findings 2, 3, 5 and 8."""
    chat = '{"messages": [{"role": "user", "content": "%s"}], "max_tokens": 2}'
    out = {f"{k} {v}": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "%s": %s}' % (k, v))
           for k in ("temperature", "top_p", "typical_p", "repetition_penalty") for v in ("1e-39", "1e-300")}
    out.update({
        "surrogate prompt": ("/v1/completions", '{"prompt": "Hi \\ud800", "max_tokens": 2}'),
        "surrogate stop": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "stop": ["\\udc00"]}'),
        "surrogate key": ("/v1/completions", '{"prompt": "Hi", "\\ud800": 1}'),
        "surrogate message": ("/v1/chat/completions", chat % "\\ud83d"),
        "NaN max_tokens": ("/v1/completions", '{"prompt": "Hi", "max_tokens": NaN}'),
        "Infinity n": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "n": Infinity}'),
        "NaN logprobs": ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "logprobs": NaN}'),
        "100,000-deep body": ("/v1/completions", '{"prompt": ' + DEEP + "}"),
        "2,000-deep schema": ("/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2,
                                                             "structured_outputs": {"json": DEEP_SCHEMA}})),
        "beam search, length penalty -5": ("/v1/completions", json.dumps(
            {"prompt": "The quick brown", "max_tokens": CUT_TOKENS, "use_beam_search": True, "n": 4,
             "length_penalty": -5})),
        "echo of a long prompt": ("/v1/completions", json.dumps(
            {"prompt": "the quick brown fox " * 1500, "max_tokens": 1, "echo": True, "logprobs": 1})),
    })
    return out


def _page_requests(fns: dict[str, int], controls: list) -> dict[str, tuple[str, str, str]]:
    """name -> (method, path, raw body): gradio's requests of findings 3 and 4."""
    data = json.dumps(controls)
    generate = fns["generate"]
    join = '{"data": %s, "fn_index": %d, "session_hash": "%s"}'
    return {
        "fn_index 9999": ("POST", "/gradio_api/queue/join", join % ("[]", 9999, "f1")),
        "surrogate prompt": ("POST", "/gradio_api/queue/join",
                             join % (data.replace('"PROMPT"', '"\\ud800"'), generate, "f2")),
        "NaN max new tokens": ("POST", "/gradio_api/queue/join", join % (data.replace("4242", "NaN"), generate, "f3")),
        "100,000-deep body": ("POST", "/gradio_api/queue/join", join % (DEEP, generate, "f4")),
        "a stream of a session that never joined": ("GET", "/gradio_api/queue/data?session_hash=never", ""),
        "another visitor's session": ("POST", "/gradio_api/queue/join", None),  # filled in by `findings`
    }


class Log:
    """Each request's outcome: its status, or how its connection was dropped."""

    def __init__(self):
        self.entries: list[tuple[str, str, object]] = []  # (door, name, status or "dropped: ...")
        self._lock = threading.Lock()

    def add(self, door: str, name: str, outcome) -> None:
        with self._lock:
            self.entries.append((door, name, outcome))

    def request(self, http: httpx.Client, door: str, name: str, method: str, path: str, body: str | None, **kw):
        try:
            r = http.request(method, path, content=body.encode() if body else None,
                             headers={"content-type": "application/json"}, **kw)
            self.add(door, name, r.status_code)
            return r
        except httpx.HTTPError as e:  # the connection broke, or no answer came
            self.add(door, name, f"dropped: {type(e).__name__}")
            return None


def _stream_then(http: httpx.Client, log: Log, name: str, fn: int, data: list, session: str, cancel: bool,
                 settle_s: float) -> None:
    """A page client: join with a run, read its stream a moment, then leave (or cancel first)."""
    r = log.request(http, "cut", f"{name}: join", "POST", "/gradio_api/queue/join", json.dumps(
        {"data": data, "fn_index": fn, "session_hash": session, "event_data": None, "trigger_id": None}))
    if r is None or r.status_code != 200:
        return
    event = r.json()["event_id"]
    with http.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}) as s:
        deadline = time.monotonic() + settle_s
        for line in s.iter_lines():
            if "process_starts" in line or time.monotonic() > deadline:
                break
        time.sleep(settle_s)  # a few steps into the run
        if cancel:
            log.request(http, "cut", f"{name}: cancel", "POST", "/gradio_api/cancel", json.dumps(
                {"session_hash": session, "fn_index": fn, "event_id": event}))


def _api_cut(url: str, log: Log, name: str, path: str, body: dict, settle_s: float) -> None:
    """An API client that sends a long request and closes its connection mid-answer."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    payload = json.dumps(body).encode()
    try:
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            time.sleep(settle_s)
        log.add("cut", name, "left")
    except OSError as e:
        log.add("cut", name, f"dropped: {type(e).__name__}")


def findings(url: str, controls, settle_s: float = 0.2) -> dict:
    """Every request of the findings, then runs of each kind cut mid-way (one visitor address each,
    so that the page's per-visitor limits let each run start). controls(**kw): /generate's values."""
    url = url.rstrip("/")
    log = Log()
    deadline = time.monotonic() + 120  # the API is mounted just after the page starts serving
    while httpx.get(url + "/v1/models", timeout=60).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    deps = httpx.get(url + "/config", timeout=120).json()["dependencies"]
    fns = {d.get("api_name"): d["id"] for d in deps}
    with httpx.Client(base_url=url, timeout=600) as http:
        for name, (path, body) in _api_requests().items():
            log.request(http, "api", name, "POST", path, body)
    owner = httpx.Client(base_url=url, timeout=600, headers={"X-Forwarded-For": "198.51.100.201"})
    other = httpx.Client(base_url=url, timeout=600, headers={"X-Forwarded-For": "198.51.100.202"})
    try:
        for http in (owner, other):
            http.get("/")  # each visitor's key
        page = _page_requests(fns, controls(prompt="PROMPT", max_new_tokens=4242))
        for name, (method, path, body) in page.items():
            if body is None:  # the owner's session, named by the other visitor
                owner.post("/gradio_api/queue/join", json={"data": controls(max_new_tokens=2), "fn_index": fns["generate"],
                                                           "session_hash": "owned-1"})
                body = json.dumps({"data": controls(max_new_tokens=2), "fn_index": fns["branch"], "session_hash": "owned-1"})
                log.request(other, "page", name, method, path, body)
                continue
            log.request(other, "page", name, method, path, body)
    finally:
        owner.close()
        other.close()
    # Runs of every kind, cut: each through its own visitor (address), one after another.
    kinds = {
        "beam search": ("beam_search", controls(max_new_tokens=CUT_TOKENS, num_beams=8, temperature=0.0)),
        "speculative": ("speculative", [*controls(max_new_tokens=CUT_TOKENS, temperature=0.0), "prompt-lookup", 1, 1]),
        "many samples": ("samples", [*controls(max_new_tokens=CUT_TOKENS), 8]),
        "plain": ("generate", controls(max_new_tokens=CUT_TOKENS)),
    }
    n = 0
    for kind, (fn_name, data) in kinds.items():
        for how in ("leaves", "cancels"):
            n += 1
            with httpx.Client(base_url=url, timeout=600, headers={"X-Forwarded-For": f"198.51.100.{10 + n}"}) as http:
                http.get("/")
                _stream_then(http, log, f"{kind} {how}", fns[fn_name], data, f"cut-{n}", how == "cancels", settle_s)
    for name, path, body in (
            ("API beam search leaves", "/v1/completions",
             {"prompt": "The quick", "max_tokens": CUT_TOKENS, "use_beam_search": True, "n": 8}),
            ("API samples leave", "/v1/completions", {"prompt": "The quick", "max_tokens": CUT_TOKENS, "n": 1}),
            ("API stream leaves", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": CUT_TOKENS, "stream": True})):
        _api_cut(url, log, name, path, body, settle_s)
    errors = [e for e in log.entries if isinstance(e[2], int) and e[2] >= 500]
    dropped = [e for e in log.entries if isinstance(e[2], str) and e[2].startswith("dropped")]
    refused = [e for e in log.entries if isinstance(e[2], int) and 400 <= e[2] < 500]
    return {"requests": len(log.entries), "server_errors": len(errors), "dropped": len(dropped),
            "refused_4xx": len(refused), "entries": log.entries, "error_entries": errors + dropped}


class CutWatch:
    """In the server: for every run whose cancel flag is set, the forward passes that started after
    it until its blocks were back (the scheduler's passes; a speculative run's rounds). Installed
    on an engine before it serves; `report()` is what bench.adversarial writes at the end."""

    def __init__(self, engine):
        from inference.decoding import speculative
        self.passes, self.rounds, self.cut = 0, 0, []  # cut: (kind, passes after the cut)
        self._lock = threading.Lock()
        sched = engine.scheduler
        step, submit = sched._step, sched.submit

        def counted_step(active):
            with self._lock:
                self.passes += 1
            return step(active)

        def watched_submit(*args, **kwargs):
            run = submit(*args, **kwargs)
            self._watch(run.cancel, run.released, "scheduler", lambda: self.passes)
            return run

        sched._step, sched.submit = counted_step, watched_submit
        rows, run = speculative.PagedSequence.rows, speculative.Speculator.run

        def counted_rows(seq, *a, **k):
            with self._lock:
                self.rounds += 1
            return rows(seq, *a, **k)

        def watched_run(spec, request, cancel=None):
            ended = threading.Event()
            if cancel is not None:
                self._watch(cancel, ended, "speculative", lambda: self.rounds)
            try:
                yield from run(spec, request, cancel)
            finally:
                ended.set()

        speculative.PagedSequence.rows, speculative.Speculator.run = counted_rows, watched_run

    def _watch(self, cancel: threading.Event, released: threading.Event, kind: str, clock) -> None:
        """Note clock() when `cancel` is first set (one flag may cancel several runs: a batch of
        samples) and again when `released` is: the passes that started between."""
        if not hasattr(cancel, "_cut_at"):
            cancel._cut_at = {}
            set_cancel = cancel.set

            def on_cancel():
                cancel._cut_at.setdefault("cut", clock())
                set_cancel()
            cancel.set = on_cancel
        set_released = released.set

        def on_released():
            if "cut" in cancel._cut_at:
                with self._lock:
                    self.cut.append((kind, clock() - cancel._cut_at["cut"]))
            set_released()
        released.set = on_released

    def report(self) -> dict:
        with self._lock:
            steps = [n for _, n in self.cut]
            return {"cut_runs": len(self.cut), "most_passes_after_a_cut": max(steps) if steps else None,
                    "cut": list(self.cut)}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.report()))
