"""A hostile visitor beside a well-behaved user on a page with a shared page's limits: the
well-behaved user's time to first token alone and while the visitor attacks, in one run.

    python -m bench.adversarial                              # the default model
    python -m bench.adversarial --random tiny --step-ms 15   # random weights of a tiny shape,
                                                             # each forward pass 15 ms longer

The page runs in a process of its own on loopback (one run and 4 sessions per visitor, at most 40
new tokens a run); the visitor in another, as on another machine: uploads, 8 MB prompts, a
20 MiB body, sessions past its share, Generate and Stop at once, capped runs back to back, a
fixed number of requests of each (VISITOR_REQUESTS). The well-behaved user runs one greedy prompt
alone, then again and again for as long as the visitor lasts, then alone again. Reported: the
median TTFT alone and under attack and their ratio, how many of the user's texts under attack
equal its text alone, the server's CPU time for a refused 8 MB prompt against a refused empty
one, and the visitor's requests by kind. Writes bench/results/adversarial[-SHAPE].{md,json}.
tests/shared_page/test_adversarial.py runs this measurement and checks what does not depend on speed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.findings import CutWatch, findings  # noqa: E402
from bench.page_client import free_port, wait_until_served  # noqa: E402
from ui.controls import Controls  # noqa: E402
from ui.shared.outputs import RUN_OUTPUTS  # noqa: E402

STATS, TOKENS = RUN_OUTPUTS.index("stats"), RUN_OUTPUTS.index("api_tokens")  # /generate's outputs

CAP_TOKENS, SESSIONS = 40, 4  # the page's limits: new tokens a run, sessions a visitor
# Visitors' addresses as a share tunnel forwards them; the hostile visitor has two.
GOOD, BAD, BAD2 = "198.51.100.10", "203.0.113.66", "203.0.113.67"
# /generate's inputs, in the order the page passes them (from the settings schema).
GOOD_SETTINGS = dict(prompt="The quick", temperature=0.0, max_new_tokens=20, seed="5")
GOOD_ARGS = Controls(**GOOD_SETTINGS).values()


def args(**kw) -> list:
    """/generate's positional values: the good user's settings with `kw` replacing some, by name."""
    return Controls(**{**GOOD_SETTINGS, **kw}).values()
BIG_PROMPT = "fox " * 2_000_000  # 8 MB
# The visitor's requests, by kind, every one made whatever the speed of either side.
VISITOR_REQUESTS = {"long": 13, "generate/stop": 25, "too many tokens": 25, "upload": 8, "file": 8,
                    "8mb": 4, "20mib": 4, "session": 2 * SESSIONS}


def good_run(client) -> tuple[float, str]:
    """(seconds from submit to the first update holding a token, the final text)."""
    t0 = time.perf_counter()
    job = client.submit(*GOOD_ARGS, api_name="/generate")
    ttft = None
    for update in job:
        if ttft is None and re.search(r"^\| generated \| [1-9]", update[STATS], re.M):  # a token shown
            ttft = time.perf_counter() - t0
    final = job.outputs()[-1]
    return ttft, "".join(t["token"] for t in final[TOKENS])  # the tokens, complete in the last update


# ------------------------------------------------------------------ the hostile visitor


def _client(url, address):
    from gradio_client import Client
    return Client(url, verbose=False, headers={"X-Forwarded-For": address})


def uploads(url, log):
    import httpx
    payload = os.urandom(5 * 1024 * 1024)
    with httpx.Client(base_url=url, headers={"X-Forwarded-For": BAD}, timeout=60) as http:
        for _ in range(VISITOR_REQUESTS["upload"]):
            r = http.post("/gradio_api/upload", files={"files": ("x.bin", payload)})
            log.append(["upload", r.status_code])
            r = http.get("/gradio_api/file=/etc/hostname")
            log.append(["file", r.status_code])


def oversized(url, log):
    """8 MB prompts (the message and the round trip's seconds), and 20 MiB bodies announced."""
    client = _client(url, BAD2)
    try:
        for _ in range(VISITOR_REQUESTS["8mb"]):
            t = time.perf_counter()
            try:
                client.predict(*args(prompt=BIG_PROMPT), api_name="/generate")
                log.append(["8mb", "accepted", time.perf_counter() - t])
            except Exception as e:  # noqa: BLE001 - the refusal is the point
                log.append(["8mb", str(e), time.perf_counter() - t])
            host, port = url.removeprefix("http://").rstrip("/").split(":")
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.sendall(b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: " + BAD.encode()
                          + b"\r\nContent-Length: 20971520\r\n\r\n{")
                log.append(["20mib", s.recv(64).decode(errors="replace")])
    finally:
        client.close()


def many_sessions(url, log):
    """New sessions, one after another (a Client each), past the visitor's share: each kept open
    (its heartbeat on) until the last is made, so the count does not depend on how soon the
    server notices a closed one."""
    clients = []
    try:
        for _ in range(VISITOR_REQUESTS["session"]):
            try:
                clients.append(client := _client(url, BAD))
            except Exception as e:  # noqa: BLE001
                log.append(["session", f"connect: {e}"])
                continue
            try:
                client.predict(api_name="/stop")
                log.append(["session", "opened"])
            except Exception as e:  # noqa: BLE001
                log.append(["session", str(e)])
    finally:
        for client in clients:
            client.close()


def generate_stop(url, log):
    client = _client(url, BAD)
    try:
        for i in range(VISITOR_REQUESTS["generate/stop"]):
            job = client.submit(*args(prompt=f"Spam {i}", max_new_tokens=CAP_TOKENS, seed=""), api_name="/generate")
            time.sleep(0.05 * (i % 4))  # Stop at once, or a little later
            stop = ""
            try:  # (on a busy machine gradio_client has cancelled its own wait for the answer)
                client.predict(api_name="/stop")
            except Exception as e:  # noqa: BLE001
                stop = f" (its Stop: {type(e).__name__} {e})"
            try:
                job.result(timeout=60)
                log.append(["generate/stop", "ended" + stop])
            except Exception as e:  # noqa: BLE001
                log.append(["generate/stop", str(e) + stop])
            try:
                client.predict(*args(max_new_tokens=10_000, seed=""), api_name="/generate")
                log.append(["too many tokens", "accepted"])
            except Exception as e:  # noqa: BLE001
                log.append(["too many tokens", str(e)])
    finally:
        client.close()


def long_runs(url, log, count):
    """Runs of the most tokens allowed, back to back: the visitor's share of the engine, full."""
    client = _client(url, BAD)
    try:
        for i in range(count):
            try:
                client.predict(*args(prompt=f"Long {i}", max_new_tokens=CAP_TOKENS, seed=""), api_name="/generate")
                log.append(["long", "ran"])
            except Exception as e:  # noqa: BLE001
                log.append(["long", str(e)])
    finally:
        client.close()


def hostile_visitor(url: str, started, log_path: str) -> None:
    """One capped run first (the visitor's share, which it gets), then all the attacks at once,
    each a fixed number of requests (VISITOR_REQUESTS); the log, one JSON list a line."""
    log: list = []
    started.set()
    long_runs(url, log, 1)
    with ThreadPoolExecutor(5) as pool:
        for f in [pool.submit(long_runs, url, log, VISITOR_REQUESTS["long"] - 1),
                  *(pool.submit(f, url, log) for f in (generate_stop, uploads, oversized, many_sessions))]:
            f.result()
    with open(log_path, "w", encoding="utf-8") as out:
        for entry in log:
            out.write(json.dumps(entry) + "\n")


def start_visitor(url: str, log_path: Path):
    """The visitor in a process of its own, as on another machine: its threads do not take the
    well-behaved client's interpreter lock. Returns the process once the visitor has begun."""
    spawn = multiprocessing.get_context("spawn")
    started = spawn.Event()
    visitor = spawn.Process(target=hostile_visitor, args=(url, started, str(log_path)))
    visitor.start()
    if not started.wait(120):
        visitor.kill()
        raise RuntimeError("the visitor did not start")
    return visitor


def visitor_log(log_path: Path) -> dict[str, list]:
    """The visitor's log: each kind's entries, the kind left off."""
    kinds: dict[str, list] = {}
    for line in log_path.read_text().splitlines():
        entry = json.loads(line)
        kinds.setdefault(entry[0], []).append(entry[1:])
    return kinds


def cpu_s(pid: int) -> float:
    """The process's user + system CPU time, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve(args) -> None:
    """The page, with a shared page's limits, on args.serve_port (the benchmark's server process)."""
    from bench.shapes import random_engine
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui
    from server.limits import Limits

    engine = (random_engine(args.random, args.device, args.dtype) if args.random else
              Engine.load(args.model, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products))
    if args.step_ms:  # a sleep holds no core: a tiny model's runs last as long as a real one's
        for name in ("forward", "forward_paged"):
            forward = getattr(engine.model, name)
            setattr(engine.model, name, lambda *a, _f=forward, **k: time.sleep(args.step_ms / 1000) or _f(*a, **k))
    limits = Limits.shared(max_new_tokens=CAP_TOKENS, runs_per_client=1, sessions_per_client=SESSIONS)
    watch = CutWatch(engine) if args.cut_report else None  # the passes each cut run makes after its cut
    signal.signal(signal.SIGTERM, _interrupt)  # the measurement's terminate(): ends the wait, the report written
    try:
        serve(build_ui(engine, Handlers(engine, limits=limits)), engine, port=args.serve_port)
    finally:
        if watch is not None:
            watch.write(args.cut_report)


# ------------------------------------------------------------------ the measurement


def measure(url: str, server_pid: int, runs: int, work: Path) -> dict:
    from gradio_client import Client

    good = Client(url, verbose=False, headers={"X-Forwarded-For": GOOD})
    visitor = None
    try:
        good_run(good)  # unmeasured: the first run pays one-time costs
        alone = [good_run(good) for _ in range(runs)]
        # The server's CPU time for one refused 8 MB prompt, all of it (reading and parsing the
        # request included), against one refused empty prompt, each the better of two.
        other = Client(url, verbose=False, headers={"X-Forwarded-For": "192.0.2.9"})
        cost: dict[str, list[float]] = {"empty": [], "8 MB": []}
        for name, prompt in (("empty", ""), ("8 MB", BIG_PROMPT)) * 2:
            before = cpu_s(server_pid)
            try:
                other.predict(*args(prompt=prompt), api_name="/generate")
                raise RuntimeError(f"the {name} prompt was not refused")
            except Exception as e:  # noqa: BLE001 - the refusal is what is timed
                if "not refused" in str(e):
                    raise
            cost[name].append(1000 * (cpu_s(server_pid) - before))
        other.close()
        visitor = start_visitor(url, work / "visitor.jsonl")
        attacked = []
        while visitor.is_alive() or len(attacked) < runs:  # the whole attack, and at least `runs`
            attacked.append(good_run(good))
            if len(attacked) >= 2000:  # a hang, not a speed: the visitor makes a fixed number of requests
                raise RuntimeError("the visitor never ended")
        visitor.join()
        after = [good_run(good) for _ in range(runs)]
    finally:
        good.close()
        if visitor is not None and visitor.is_alive():  # the measurement failed mid-attack
            visitor.kill()
            visitor.join()
    if visitor.exitcode != 0:
        raise RuntimeError(f"the visitor failed (exit status {visitor.exitcode})")
    kinds = visitor_log(work / "visitor.jsonl")
    t_alone = statistics.median(t for t, _ in alone + after)
    t_attacked = statistics.median(t for t, _ in attacked)
    text = alone[0][1]
    return {"ttft_alone_ms": 1000 * t_alone, "ttft_attacked_ms": 1000 * t_attacked,
            "ttft_ratio": t_attacked / t_alone, "runs_alone": len(alone + after), "runs_attacked": len(attacked),
            "same_text_alone": sum(t == text for _, t in alone + after),
            "same_text_attacked": sum(t == text for _, t in attacked),
            "refused_empty_cpu_ms": min(cost["empty"]), "refused_8mb_cpu_ms": min(cost["8 MB"]),
            "refused_8mb_round_trip_ms": 1000 * statistics.median(e[-1] for e in kinds["8mb"]),
            "visitor_requests": {k: len(v) for k, v in kinds.items()}}


def findings_markdown(f: dict) -> list[str]:
    """The findings' requests (bench/findings.py): what came back, and the cut runs' passes."""
    most = f.get("most_passes_after_a_cut")
    return [f"- issue 59's requests: {f['requests']} ({f['refused_4xx']} refused with a 4xx), **{f['server_errors']} "
            f"server errors, {f['dropped']} dropped connections**"
            + "".join(f"\n  - {door} {name}: {outcome}" for door, name, outcome in f["error_entries"]),
            f"- cut runs the server saw: {f.get('cut_runs', 'unknown')}; **the most forward passes one made after its "
            f"cut before its blocks were back: {most if most is not None else 'none cut'}**"]


def to_markdown(r: dict) -> str:
    if "ttft_ratio" not in r:  # --findings-only
        return "\n".join([f"# Issue 59's findings against the page: {r['model']} on {r['device']}", "",
                          *findings_markdown(r["findings"])]) + "\n"
    lines = [f"# A hostile visitor beside a well-behaved user: {r['model']} on {r['device']}"
             + (f", each forward pass {r['step_ms']:g} ms longer" if r["step_ms"] else ""), "",
             f"- **TTFT under attack / alone**: {r['ttft_ratio']:.2f}× ({r['ttft_attacked_ms']:.0f} ms against "
             f"{r['ttft_alone_ms']:.0f} ms; medians of {r['runs_attacked']} and {r['runs_alone']} runs)",
             f"- the user's text equals its text alone in {r['same_text_attacked']}/{r['runs_attacked']} runs under "
             f"attack and {r['same_text_alone']}/{r['runs_alone']} alone",
             f"- server CPU for a refused 8 MB prompt: {r['refused_8mb_cpu_ms']:.0f} ms (a refused empty one: "
             f"{r['refused_empty_cpu_ms']:.0f} ms); the visitor's round trip {r['refused_8mb_round_trip_ms']:.0f} ms",
             "- the visitor's requests: " + ", ".join(f"{k} {v}" for k, v in r["visitor_requests"].items())]
    if "findings" in r:
        lines += findings_markdown(r["findings"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from inference.factory import add_model_args
    from bench.shapes import RANDOM_SHAPES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default=None,
                   help="random weights of a published shape instead of a checkpoint")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="make each forward pass this much longer (a sleep): a tiny model's runs then overlap")
    p.add_argument("--runs", type=int, default=4, help="the user's runs alone, before and after the attack")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--findings-only", action="store_true",
                   help="only issue 59's findings' requests and cut runs (bench/findings.py), not the measurement")
    p.add_argument("--serve-port", type=int, default=None, help=argparse.SUPPRESS)  # the page's process
    p.add_argument("--cut-report", default=None, help=argparse.SUPPRESS)  # where the page's process writes CutWatch's
    args = p.parse_args(argv)
    if args.serve_port:
        serve(args)
        return 0
    port = free_port()
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--findings-only"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with open(work / "server.log", "w") as server_log:
            proc = subprocess.Popen([sys.executable, "-m", "bench.adversarial", "--serve-port", str(port),
                                     "--cut-report", str(work / "cuts.json"), *forwarded],
                                    cwd=ROOT, stdout=server_log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_until_served(proc, port)
            except RuntimeError:
                print((work / "server.log").read_text()[-3000:], file=sys.stderr)
                raise
            url = f"http://127.0.0.1:{port}/"
            result = {} if args.findings_only else measure(url, proc.pid, args.runs, work)
            found = findings(url, lambda **kw: Controls(**{**GOOD_SETTINGS, **kw}).values())
            time.sleep(5)  # the last cut runs end within a step; a loaded machine's step can take seconds
        finally:
            proc.terminate()
            proc.wait(60)
        cuts = json.loads((work / "cuts.json").read_text()) if (work / "cuts.json").exists() else {}
        result["findings"] = {**found, **cuts}
    from inference.device import resolve_device
    from inference.loading.default_model import resolve_model
    result = {"model": f"{args.random} (random weights)" if args.random else Path(resolve_model(args.model)).name,
              "device": str(resolve_device(args.device)), "step_ms": args.step_ms, **result}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"adversarial-{args.random}" if args.random else "adversarial"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    md = to_markdown(result)
    (out / f"{stem}.md").write_text(md)
    print(md)
    f = result["findings"]
    most = f.get("most_passes_after_a_cut")
    return 1 if f["server_errors"] or f["dropped"] or not f.get("cut_runs") or most > 1 else 0


if __name__ == "__main__":
    raise SystemExit(main())
