"""Memory under a stream of visitors: the real app (`python app.py`) and N visitors through its
page API, each a new session (gradio_client, as a script or a tab would be) that runs a random
prompt, then leaves; every other run is stopped or abandoned mid-way. The server's resident
memory is read after each round.

    python -m bench.soak                           # 80 warm-up visitors, then 1,000 more
    python -m bench.soak --visitors 240 --trace    # ... with tracemalloc snapshots between rounds

Reports the RSS after each round, MiB per 1,000 visitors after the warm-up (the slope of a least
squares line through the rounds after it), the KV pool after the last visitor, and errors.
--trace turns tracemalloc on in the server at the warm-up's end and reports what grew from the
first round after it to the last (by file, by line, with the calls behind the largest) and the
object counts by type (gc) that grew. Its RSS includes tracemalloc's own records of every block
still alive: the figure of merit is a run without it.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.page_client import free_port, wait_until_served  # noqa: E402
from ui.shared.outputs import RUN_OUTPUTS  # noqa: E402

WORDS = ("river stone light garden winter engine music paper window silver forest market "
         "letter orange bridge cloud candle story mountain teacher").split()
KINDS = ("end", "stop", "end", "abandon")  # visitor i's run: to its end, stopped, or left mid-way
KV_TEXT, STATS = RUN_OUTPUTS.index("kv_text"), RUN_OUTPUTS.index("stats")  # /generate's outputs
FRAMES = 12  # frames tracemalloc keeps of each allocation's call chain
START_LIMIT_S = 900  # the page's start, on a machine busy with other work
VISIT_LIMIT_S = 300  # the longest wait for one visitor's run (24 tokens among 8 take seconds)
REQUEST_LIMIT_S = 60  # the longest wait for one answer of the server


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def controls(rng: random.Random, tokens: int) -> list:
    from ui.controls import Controls
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize()
    return Controls(prompt=prompt, temperature=1.0, max_new_tokens=tokens, seed="").values()


def first_token(job, limit_s: float) -> None:
    """Wait for the run's first token (its stats line counts one), or its end. Polled, not
    iterated: a job whose end never comes would hold the iterator, and the soak, for ever."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        outs = job.outputs()
        if (outs and "| generated |" in outs[-1][STATS]) or job.done():
            return
        time.sleep(0.05)
    raise TimeoutError(f"no token and no end within {limit_s:.0f} s (job {job.status().code.name})")


def visitor(url: str, i: int, tokens: int, seed: int) -> str:
    """One visitor: a new session, one run, gone. Returns how the run ended; a run that hangs
    raises TimeoutError after VISIT_LIMIT_S."""
    from gradio_client import Client
    kind = KINDS[i % len(KINDS)]
    # A browser waits for a busy server; httpx's default (5 s a request) would count a slow
    # answer on a loaded machine as a failed one.
    client = Client(url, verbose=False, httpx_kwargs={"timeout": REQUEST_LIMIT_S})
    try:
        job = client.submit(*controls(random.Random(seed + i), tokens), api_name="/generate")
        if kind != "end":
            first_token(job, VISIT_LIMIT_S)
        if kind == "abandon":
            job.cancel()
            return kind
        if kind == "stop":
            client.submit(api_name="/stop").result(timeout=VISIT_LIMIT_S)
        job.result(timeout=VISIT_LIMIT_S)
        return kind
    finally:
        client.close()  # the tab closes: its heartbeat ends


def pool_line(url: str) -> str:
    """The KV pool as a last, greedy run alone sees it: the page's own pool line."""
    from gradio_client import Client
    # A browser waits for a busy server; httpx's default (5 s a request) would count a slow
    # answer on a loaded machine as a failed one.
    client = Client(url, verbose=False, httpx_kwargs={"timeout": REQUEST_LIMIT_S})
    try:
        from ui.controls import Controls
        out = client.predict(*Controls(prompt="The pool after the soak", temperature=0.0, max_new_tokens=2,
                                       seed="1").values(), api_name="/generate")
    finally:
        client.close()
    m = re.search(r"The server's pool(?: then)? \(all runs\): \*\*([\d,]+) of ([\d,]+) blocks\*\* in use.*? by "
                  r"(this run alone|this run and \d+ others?)", out[KV_TEXT], re.S)
    cached = re.search(r"([\d,]+) kept from finished runs", out[KV_TEXT])
    if m is None:
        return "unknown (no pool line)"
    return (f"{m.group(1)} of {m.group(2)} blocks in use by {m.group(3).replace('this run', 'the probe')}"
            + (f", {cached.group(1)} kept in the prefix cache" if cached else ""))


# ------------------------------------------------------------------ tracemalloc in the server

def serve_traced(out_dir: str, app_args: list[str]) -> int:
    """The app; on SIGUSR1 it writes a tracemalloc snapshot and object counts by type.
    tracemalloc starts at the first signal (the end of the warm-up), not at launch: what grows
    is what was allocated after it, and the model's loading is not slowed by it."""
    import tracemalloc
    taken = iter(range(10**6))

    def dump(signum, frame):
        if not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
        n = next(taken)
        gc.collect()
        counts = Counter(type(o).__qualname__ for o in gc.get_objects())
        Path(out_dir, f"types-{n}.json").write_text(json.dumps(counts))
        tracemalloc.take_snapshot().dump(str(Path(out_dir, f"snap-{n}.pickle")))
        Path(out_dir, f"done-{n}").touch()

    signal.signal(signal.SIGUSR1, dump)
    import app
    return app.main(app_args)


def snapshot(proc, out_dir: Path, n: int) -> None:
    proc.send_signal(signal.SIGUSR1)
    while not (out_dir / f"done-{n}").exists():
        if proc.poll() is not None:
            raise RuntimeError("the server exited")
        time.sleep(0.5)


def _where(frame) -> str:
    name = frame.filename.replace(str(ROOT) + "/", "")
    return f"{re.sub(r'^.*/site-packages/', '', name)}:{frame.lineno}"


def trace_report(out_dir: Path, a: int, b: int, visitors: int, top: int = 15) -> str:
    """What grew between snapshots a and b: in all, by file, by line (with the calls that led to
    the largest lines' allocations), and the objects by type that gc counted more of."""
    import tracemalloc
    s0 = tracemalloc.Snapshot.load(str(out_dir / f"snap-{a}.pickle"))
    s1 = tracemalloc.Snapshot.load(str(out_dir / f"snap-{b}.pickle"))
    by_file = s1.compare_to(s0, "filename")
    total = sum(d.size_diff for d in by_file)
    lines = [f"tracemalloc, {visitors} visitors between snapshots: {total / 1024:+,.0f} KiB in all "
             f"({total / 1024 / visitors:+.1f} KiB a visitor); the files that grew most:"]
    lines += [f"  {d.size_diff / 1024:+9.1f} KiB {d.count_diff:+7d} blocks  {_where(d.traceback[0]).rsplit(':', 1)[0]}"
              for d in by_file[:top // 2]]
    lines.append("the lines that grew most:")
    by_line = s1.compare_to(s0, "lineno")
    for d in by_line[:top]:
        lines.append(f"  {d.size_diff / 1024:+9.1f} KiB {d.count_diff:+7d} blocks  {_where(d.traceback[0])}")
    # Who allocated the largest lines' growth: their biggest call chain, innermost last.
    lines.append("the calls behind the five lines that grew most (the largest chain each, innermost last):")
    chains = s1.compare_to(s0, "traceback")
    for d in by_line[:5]:
        frame = d.traceback[0]
        chain = next((c for c in chains if c.traceback[-1] == frame), None)
        if chain is not None:
            lines.append(f"  {_where(frame)} ({chain.size_diff / 1024:+.1f} KiB): "
                         + " > ".join(_where(f) for f in chain.traceback))
    t0 = json.loads((out_dir / f"types-{a}.json").read_text())
    t1 = json.loads((out_dir / f"types-{b}.json").read_text())
    grew = sorted(((t1.get(k, 0) - t0.get(k, 0), k) for k in t1), reverse=True)[:top]
    lines.append("objects by type (gc), growth between the snapshots:")
    lines += [f"  {n:+8d} {k}" for n, k in grew if n > 0]
    return "\n".join(lines)


# ------------------------------------------------------------------ the soak

def calls_of(e: BaseException) -> str:
    """Where an error came from: the visitor's own line, then the innermost call."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if f.filename == __file__]
    shown = ([mine[-1]] if mine else []) + [frames[-1]] if frames else []
    return " > ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in shown)


def slope_per_1000(points: list[tuple[int, float]]) -> float:
    """MiB per 1,000 visitors: least squares over (visitors, RSS MiB)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 1000 * sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def soak(a) -> dict:
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="tokenlab-soak-"))
    app_args = ["--port", str(port), *a.app_args]
    cmd = ([sys.executable, "-m", "bench.soak", "--serve-traced", str(work), "--", *app_args] if a.trace
           else [sys.executable, "app.py", *app_args])
    log = open(work / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    rounds, errors, kinds = [], [], Counter()
    try:
        wait_until_served(proc, port, START_LIMIT_S)
        url = f"http://127.0.0.1:{port}/"
        done = 0
        rounds.append((0, rss_mib(proc.pid)))
        print(f"start: RSS {rounds[-1][1]:,.0f} MiB", flush=True)
        snaps = 0
        with ThreadPoolExecutor(a.clients) as pool:
            while done < a.visitors:
                n = min(a.round, a.visitors - done)
                futures = [pool.submit(visitor, url, done + k, a.tokens, a.seed) for k in range(n)]
                for f in futures:
                    try:
                        kinds[f.result()] += 1
                    except Exception as e:  # noqa: BLE001 - counted and reported
                        errors.append(f"{type(e).__name__}: {str(e)[:200]} ({calls_of(e)})")
                done += n
                time.sleep(a.settle_s)  # the last visitors' heartbeats end, their tabs' unload runs
                if a.trace and done >= a.warmup:
                    snapshot(proc, work, snaps)
                    snaps += 1
                rounds.append((done, rss_mib(proc.pid)))
                print(f"{done:5d} visitors: RSS {rounds[-1][1]:,.0f} MiB", flush=True)
        pool_at_end = pool_line(url)
        # From the first round after the warm-up's end to the last: the growth of several rounds.
        first = 1 if snaps >= 3 else 0
        trace = (trace_report(work, first, snaps - 1, (snaps - 1 - first) * a.round)
                 if a.trace and snaps >= 2 else None)
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    after = [(v, m) for v, m in rounds if v >= a.warmup]
    return {"visitors": a.visitors, "warmup": a.warmup, "clients": a.clients, "tokens": a.tokens,
            "app_args": a.app_args, "rounds": rounds, "kinds": dict(kinds), "errors": errors,
            "mib_per_1000": slope_per_1000(after) if len(after) >= 2 else float("nan"),
            "growth_after_warmup_mib": after[-1][1] - after[0][1] if after else float("nan"),
            "pool_at_end": pool_at_end, "trace": trace}


def to_markdown(r: dict) -> str:
    lines = [f"# Soak: {r['visitors']:,} visitors through the page ({r['clients']} at a time, "
             f"{r['tokens']} sampled tokens a run{', app ' + ' '.join(r['app_args']) if r['app_args'] else ''})", "",
             f"- **{r['mib_per_1000']:.1f} MiB of RSS per 1,000 visitors** after a warm-up of {r['warmup']} "
             f"(least squares over the rounds after it; {r['growth_after_warmup_mib']:+.0f} MiB from "
             f"visitor {r['warmup']} to {r['visitors']})",
             "- RSS after each round (visitors: MiB): " + ", ".join(f"{v}: {m:,.0f}" for v, m in r["rounds"]),
             "- runs: " + ", ".join(f"{k} {n}" for k, n in sorted(r["kinds"].items())),
             f"- errors: {len(r['errors'])}" + "".join(f"\n  - {e}" for e in r["errors"][:10]),
             f"- KV pool after the last visitor: {r['pool_at_end']}"]
    if r["trace"]:
        lines += ["", "```", r["trace"], "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve-traced"]:  # the server process of --trace
        return serve_traced(argv[1], argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--visitors", type=int, default=1080, help="visitors in all, the warm-up included")
    p.add_argument("--warmup", type=int, default=80)
    p.add_argument("--round", type=int, default=80, help="visitors between two readings")
    p.add_argument("--clients", type=int, default=8, help="visitors at a time")
    p.add_argument("--tokens", type=int, default=24, help="max new tokens a run (sampled, temperature 1)")
    p.add_argument("--seed", type=int, default=0, help="the prompts' random seed")
    p.add_argument("--settle-s", type=float, default=2.0, help="wait after each round before reading RSS")
    p.add_argument("--trace", action="store_true", help="tracemalloc in the server (slower)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("app_args", nargs="*", help="after --: the app's own flags (e.g. -- --share)")
    a = p.parse_args(argv)
    r = soak(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(r, indent=1))
    md = to_markdown(r)
    (out / "soak.md").write_text(md)
    print(md)
    return 1 if r["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
