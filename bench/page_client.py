"""One run through the page's /generate API, as the benchmarks' page user: Gradio's queue
protocol spoken directly (join the queue, then read the session's event stream), the way
gradio_client speaks it but without its worker threads and their 50 ms polling, so that clients
sharing the server's machine take as little of its CPU as a client can.

    python -m bench.page_client URL '[controls...]' [--wait] [--gradio-client]

Prints one JSON line: the arrivals [(seconds since the start, tokens generated so far)] of
every page update, the text the run generated, the CPU seconds the client took, and when its last
update came (`end`: time.perf_counter(), the system's monotonic clock, which the caller's process
reads alike). It opens its session first, as a page's load does. With --wait it connects, prints
"ready" and starts when a line arrives on stdin (so that many clients start together). With
--gradio-client the run goes through gradio_client instead (what a Python user of the API runs;
its threads cost the machine more CPU).
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import socket
import sys
import time

import httpx

STATS, TOKENS = 2, 7  # /generate's outputs: the stats table counts the tokens; the tokens, complete at the end


def generated(stats: str) -> int:
    """The "generated" row of the run statistics table (0 before the first token)."""
    m = re.search(r"^\| generated \| (\d+) \|", stats or "", re.M)
    return int(m.group(1)) if m else 0


def text_of(tokens: list[dict]) -> str:
    """The run's text from /generate's tokens output (one entry per piece of text)."""
    return "".join(t["token"] for t in tokens)


def apply_diff(value, diff: list):
    """A streamed output's new value from Gradio's diff of a string: replace or append."""
    for action, path, new in diff:
        if path or action not in ("replace", "append"):
            raise ValueError(f"unexpected diff {action!r} at {path!r} for a string output")
        value = new if action == "replace" else value + new
    return value


class PageClient:
    def __init__(self, url: str, api_name: str = "generate"):
        self.url = url.rstrip("/") + "/"
        self.http = httpx.Client(timeout=httpx.Timeout(600, connect=30))
        deps = self.http.get(self.url + "config").raise_for_status().json()["dependencies"]
        self.fn_index = next(d["id"] for d in deps if d.get("api_name") == api_name)
        self.stop_index = next(d["id"] for d in deps if d.get("api_name") == "stop")
        self.session = secrets.token_hex(8)

    def open_session(self) -> None:
        """Open this client's session on the server before its run, as a browser tab's page load
        does (its load event): Gradio builds a new session's state from every block's config,
        ~20-30 ms of the server's event loop a session (338 blocks), which a visitor pays once at
        the page's load and not at each run. /stop with nothing going stops nothing."""
        self.http.post(self.url + "gradio_api/run/predict", json={
            "data": [], "fn_index": self.stop_index, "session_hash": self.session}).raise_for_status()

    def run(self, args: list) -> tuple[list[tuple[float, int]], str]:
        """Submit one run and follow its updates to the end: [(time, tokens so far)], text."""
        session = self.session
        t0 = time.perf_counter()
        join = self.http.post(self.url + "gradio_api/queue/join", json={
            "data": args, "fn_index": self.fn_index, "session_hash": session,
            "event_data": None, "trigger_id": None})
        event_id = join.raise_for_status().json()["event_id"]
        arrivals, stats = [], None
        with self.http.stream("GET", self.url + "gradio_api/queue/data",
                              params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("event_id") != event_id:
                    continue
                if msg["msg"] == "process_completed" and not msg.get("success", True):
                    raise RuntimeError(f"the run failed: {msg.get('output')}")
                if msg["msg"] in ("process_generating", "process_completed") and msg["output"].get("data"):
                    value = msg["output"]["data"][STATS]
                    # The first update of a stream is whole; later ones are diffs of the last.
                    stats = value if stats is None or msg["msg"] == "process_completed" else apply_diff(stats, value)
                    arrivals.append((time.perf_counter() - t0, generated(stats)))
                if msg["msg"] == "process_completed":
                    return arrivals, text_of(msg["output"]["data"][TOKENS])
        raise RuntimeError("the event stream ended before the run completed")


class GradioClient:
    """The same run through gradio_client, for comparison."""

    def __init__(self, url: str, api_name: str = "generate"):
        from gradio_client import Client
        self.client, self.api_name = Client(url, verbose=False), "/" + api_name

    def run(self, args: list) -> tuple[list[tuple[float, int]], str]:
        t0 = time.perf_counter()
        updates = [(time.perf_counter() - t0, update)
                   for update in self.client.submit(*args, api_name=self.api_name)]
        return [(t, generated(u[STATS])) for t, u in updates], text_of(updates[-1][1][TOKENS])


# ------------------------------------------------------------------ the page, served

def free_port() -> int:
    """A port free on this machine now (for a page the caller starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_served(proc, port: int, limit_s: float = 300) -> None:
    """Wait until the page process `proc` accepts connections on `port`; start-up time is the
    machine's, so limit_s is an upper bound, not a measurement."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"the page exited with status {proc.returncode}: {out}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the page did not start within {limit_s:.0f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("url")
    p.add_argument("args", help="the /generate controls' values as a JSON list")
    p.add_argument("--wait", action="store_true", help='print "ready", start at a line on stdin')
    p.add_argument("--gradio-client", action="store_true", help="run through gradio_client")
    a = p.parse_args(argv)
    client = GradioClient(a.url) if a.gradio_client else PageClient(a.url)
    if isinstance(client, PageClient):
        client.open_session()
    if a.wait:
        print("ready", flush=True)
        sys.stdin.readline()  # blocks: no polling, nothing running meanwhile
    cpu0 = time.process_time()
    arrivals, text = client.run(json.loads(a.args))
    end = time.perf_counter()
    print(json.dumps({"arrivals": arrivals, "text": text, "cpu_s": time.process_time() - cpu0, "end": end}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
