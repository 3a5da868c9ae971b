"""Many users at once: aggregate and per-user decode rates for 1 and N simultaneous users,
through the engine (its scheduler), through the page (the real app and N page clients,
bench/page_client.py), through llama.cpp decoding the N sequences in one batch on the same GGUF
file (bench/peer_llama_batch.py, in each build at hand: bench/peers.py), and through a vLLM server
when one is given, on the same prompts and token counts.

    python -m bench.users                      # the default model, 1 and 8 users
    python -m bench.users --users 1 8 32 --vllm-url http://127.0.0.1:8000/v1

Ratios come first: N users' aggregate rate against one user's, each user's rate against one
user alone, and our aggregate against each peer's at the same N. Every measurement is taken
--rounds times, alternated, and each reports its median round; every user's text is compared
with its prompt's text alone (llama.cpp's with its own run alone). The read bandwidth is measured
before each round, and the engine's and llama.cpp's step at N rows set against it: the bytes a
step of N rows reads at that bandwidth, over the step's median time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference.factory import add_model_args  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402
from inference.events import DoneEvent, StepEvent  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from bench import roofline  # noqa: E402
from bench.peers import start_llama_builds  # noqa: E402
from bench.report import llama_lines, read_bound_lines  # noqa: E402
from bench.shapes import RANDOM_SHAPES, random_engine  # noqa: E402

TOPICS = ["the history of the printing press", "how bees find flowers", "the water cycle",
          "why the sky is blue", "how a steam engine works", "the rules of chess",
          "how vaccines train the immune system", "the life of a star"]


def prompt(i: int) -> str:
    """A different prompt per user, all about the same length."""
    return f"Write a short essay about {TOPICS[i % len(TOPICS)]}. Essay:"


def summarize(runs: list[dict], wall_s: float) -> dict:
    """runs: per user {tokens, ttft_s, decode_s, text, and where known intervals: the times between
    its tokens} -> aggregate and per-user rates, the median step (None unknown), and the users'
    texts (which main compares with each prompt's text alone)."""
    # A run whose tokens all came in one page update has no decode time to divide by.
    per_user = [(r["tokens"] - 1) / r["decode_s"] for r in runs if r["decode_s"] > 0] or [math.nan]
    intervals = [ms for r in runs for ms in r.get("intervals", ())]
    return {"users": len(runs), "aggregate_tok_s": sum(r["tokens"] for r in runs) / wall_s,
            "step_ms": statistics.median(intervals) if intervals else None,
            "per_user_tok_s": statistics.median(per_user), "min_user_tok_s": min(per_user),
            "ttft_s_median": statistics.median(r["ttft_s"] for r in runs),
            "ttft_s_max": max(r["ttft_s"] for r in runs), "tokens": sum(r["tokens"] for r in runs),
            "texts": [r["text"] for r in runs]}


def at_once(n: int, user, runs: list[dict], start: threading.Barrier) -> dict:
    """Run user(i) for i < n on threads that pass `start` together; summarize their runs."""
    threads = [threading.Thread(target=user, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return summarize(runs, time.perf_counter() - t0)


# ---------------------------------------------------------------- the engine

def engine_users(engine: Engine, n: int, tokens: int, top_n: int = 10) -> dict:
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    ids = [engine.prompt_ids(prompt(i)) for i in range(n)]  # as the page feeds them
    runs: list[dict] = [{} for _ in range(n)]
    start = threading.Barrier(n + 1)

    def user(i):
        start.wait()
        t0 = time.perf_counter()
        first = last = None
        count, text, intervals = 0, None, []
        for ev in engine.generate_ids(ids[i], params, top_n):
            if isinstance(ev, StepEvent):
                now = time.perf_counter()
                if last is not None:
                    intervals.append(1000 * (now - last))
                first, last = first or now, now
                count += 1
            elif isinstance(ev, DoneEvent):
                text = ev.text
        if first is None:  # a run that ended at once
            first = last = math.nan
        runs[i] = {"tokens": count, "ttft_s": first - t0, "decode_s": last - first, "text": text,
                   "intervals": intervals}

    return at_once(n, user, runs, start)


def alone_texts(engine: Engine, n: int, tokens: int) -> list[str]:
    """Each of the first n users' prompts run alone: the text every user should get, however
    many others run beside them."""
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    return [next(ev.text for ev in engine.generate_ids(engine.prompt_ids(prompt(i)), params, 10)
                 if isinstance(ev, DoneEvent)) for i in range(n)]


# ---------------------------------------------------------------- the page

def page_users(engine: Engine, n: int, tokens: int, gradio_client: bool = False) -> dict:
    """n page clients (bench/page_client.py, each its own process) connect first, then all
    submit at once. The clients run on this machine too: the CPU time they take while the runs
    last is reported beside the rates."""
    from ui.controls import Controls
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui

    demo = build_ui(engine, Handlers(engine))
    _, url, _ = serve(demo, engine, block=False, queue_size=max(16, 2 * n))
    procs: list[subprocess.Popen] = []
    try:
        procs += [subprocess.Popen(
            [sys.executable, "-m", "bench.page_client", url, "--wait", *(["--gradio-client"] * gradio_client),
             json.dumps(Controls(prompt=prompt(i), temperature=0.0, max_new_tokens=tokens, seed="1").values())],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(n)]
        for proc in procs:  # each has connected
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a page client failed to connect")
        t0, cpu0 = time.perf_counter(), time.process_time()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        clients = [json.loads(p.communicate(timeout=1800)[0].strip().splitlines()[-1]) for p in procs]
        exited, server_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        # The runs end at the last client's last update, as the engine's end at its last event: the
        # clients' processes exiting after it is not the page's time (perf_counter is the system's
        # monotonic clock on Linux, the same in every process; elsewhere the exits are counted).
        last = max(c["end"] for c in clients) - t0
        wall = last if sys.platform == "linux" and 0 < last <= exited else exited
    finally:
        for proc in procs:  # a client left waiting when another failed
            proc.kill()
        demo.close()
    runs = []
    for c in clients:
        got = [(t, k) for t, k in c["arrivals"] if k > 0] or [(math.nan, 0)]  # (a run may end at once)
        runs.append({"tokens": got[-1][1], "ttft_s": got[0][0], "decode_s": got[-1][0] - got[0][0],
                     "text": c["text"]})
    return {**summarize(runs, wall), "clients_cpu_s": sum(c["cpu_s"] for c in clients), "wall_s": wall,
            "wall_to_exits_s": exited,
            "server_cpu_s": server_cpu, "updates": sum(len(c["arrivals"]) for c in clients)}


# ---------------------------------------------------------------- vLLM

def vllm_users(url: str, model: str | None, n: int, tokens: int) -> dict:
    """n streamed completions at once against a running vLLM server (OpenAI API)."""
    import httpx

    base = url.rstrip("/")
    model = model or httpx.get(f"{base}/models", timeout=30).json()["data"][0]["id"]
    runs: list[dict] = [{} for _ in range(n)]
    start = threading.Barrier(n + 1)

    def user(i):
        body = {"model": model, "prompt": prompt(i), "max_tokens": tokens, "temperature": 0.0,
                "stream": True, "logprobs": 10, "ignore_eos": False}
        start.wait()
        t0 = time.perf_counter()
        first = last = None
        count, text = 0, ""
        with httpx.stream("POST", f"{base}/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                got = len((chunk["choices"][0].get("logprobs") or {}).get("tokens") or []) or 1
                last = time.perf_counter()
                first = first or last
                count += got
                text += chunk["choices"][0].get("text") or ""
        if first is None:  # a run that ended at once
            first = last = math.nan
        runs[i] = {"tokens": count, "ttft_s": first - t0, "decode_s": last - first, "text": text}

    return at_once(n, user, runs, start)


# ---------------------------------------------------------------- llama.cpp

def llama_peers(engine: Engine, gguf: Path | None, users: list[int], tokens: int, out_dir: Path) -> tuple[dict, dict]:
    """llama.cpp decoding up to max(users) sequences in one batch on the same GGUF file, the same
    prompt ids, as many threads as ours, in every build at hand: ({"llama.cpp BUILD": peer},
    {build: why it did not start})."""
    import torch
    if gguf is None:
        return {}, {}
    out_dir.mkdir(parents=True, exist_ok=True)
    ids_file = out_dir / "llama-users-ids.json"
    ids_file.write_text(json.dumps([engine.prompt_ids(prompt(i)) for i in range(max(users))]))
    peers, failed = start_llama_builds("peer_llama_batch.py", [gguf, ids_file, tokens, torch.get_num_threads(), max(users)])
    return {f"llama.cpp {build}": peer for build, peer in peers.items()}, failed


def llama_users(peer, n: int) -> dict:
    """A round of n users through a llama.cpp batch peer, summarized as ours are."""
    r = peer.measure(n)
    return {**summarize(r["runs"], r["wall_s"]), "step_ms": r["step_ms"]}


# ---------------------------------------------------------------- report

def median_round(runs: list[dict]) -> dict:
    """The round whose aggregate rate is the median (the lower middle of an even count), with
    every round's aggregate beside it, and the fewest users that got their alone text in any."""
    by_rate = sorted(runs, key=lambda r: r["aggregate_tok_s"])
    out = {**by_rate[(len(by_rate) - 1) // 2], "rounds_tok_s": [r["aggregate_tok_s"] for r in runs]}
    if "same_as_alone" in out:
        out["same_as_alone"] = min(r["same_as_alone"] for r in runs)
    if "read_bound_fraction" in out:  # each round against its own bandwidth: their median
        out["read_bound_fraction_by_round"] = [r["read_bound_fraction"] for r in runs]
        out["read_bound_fraction"] = statistics.median(out["read_bound_fraction_by_round"])
    return out


def ratios(rows: dict[str, dict[int, dict]], users: list[int]) -> dict:
    out = {}
    one, many = users[0], users[-1]
    for system, by_n in rows.items():
        if one in by_n and many in by_n and many != one:
            out[f"{system}: aggregate {many} users / 1 user"] = by_n[many]["aggregate_tok_s"] / by_n[one]["aggregate_tok_s"]
            out[f"{system}: each of {many} users / 1 user alone"] = by_n[many]["min_user_tok_s"] / by_n[one]["per_user_tok_s"]
    for peer in [p for p in rows if p == "vllm" or p.startswith("llama.cpp")]:
        for system in ("engine", "page"):
            for n in users:
                if n in rows.get(system, {}) and n in rows[peer]:
                    name = "vLLM" if peer == "vllm" else peer
                    out[f"{system} / {name} aggregate at {n} users"] = (
                        rows[system][n]["aggregate_tok_s"] / rows[peer][n]["aggregate_tok_s"])
    return out


def read_bound(rows: dict[str, dict[int, dict]]) -> dict:
    """The step's fraction of its read-bound time, per system and number of rows (report.read_bound_lines)."""
    return {f"{system}, {n} user{'s' * (int(n) != 1)}": {"rows": int(n), **{k: r[k] for k in (
                "step_bytes", "read_bound_fraction", "read_bound_fraction_by_round")}}
            for system, by_n in rows.items() for n, r in by_n.items() if "read_bound_fraction" in r}


def to_markdown(result: dict) -> str:
    lines = [f"# Many users: {result['model']} on {result['device']} ({result['dtype']}), "
             f"{result['tokens']} new tokens each, the median of {result['rounds']} alternated rounds", ""]
    lines += [f"- **{k}**: {v:.2f}×" for k, v in result["ratios"].items()] + [""]
    lines += ["| system | users | aggregate tok/s | per user tok/s (median, min) | TTFT median / max |",
              "|---|---|---|---|---|"]
    for system, by_n in result["systems"].items():
        for n, r in by_n.items():
            lines.append(f"| {system} | {n} | {r['aggregate_tok_s']:.1f} | {r['per_user_tok_s']:.1f}, "
                         f"{r['min_user_tok_s']:.1f} | {r['ttft_s_median']:.2f} s / {r['ttft_s_max']:.2f} s |")
    same = [f"{system} {n} user{'s' * (int(n) != 1)} {r['same_as_alone']}/{r['users']}"
            for system, by_n in result["systems"].items() for n, r in by_n.items() if "same_as_alone" in r]
    lines += ["", "Users whose text equals their prompt's text run alone (greedy; llama.cpp's: its own ids "
              "alone), in every round: " + ", ".join(same) + "."]
    lines += read_bound_lines(read_bound(result["systems"])) + llama_lines(result.get("llama_cpp"))
    page = result["systems"].get("page", {})
    if page:
        lines += ["", f"The page's clients ({result['page_client']} processes) run on the same machine: while the "
                  "runs lasted they took " + "; ".join(
                      f"{r['clients_cpu_s']:.1f} CPU-seconds of {r['wall_s']:.1f} s for {n} user{'s' * (int(n) != 1)}"
                      for n, r in page.items()) + ". The page's time ends at its last client's last update (the "
                  "clients' exits after it: " + "; ".join(
                      f"{r['wall_to_exits_s'] - r['wall_s']:.2f} s for {n}" for n, r in page.items()
                      if "wall_to_exits_s" in r) + ")."]
    return "\n".join(lines) + "\n"


def model_gguf(args) -> Path | None:
    """The GGUF file of the model measured, for llama.cpp: --gguf, --model FILE.gguf, or the file
    a model's folder was imported from; None for random weights (unless --gguf) or a checkpoint
    without one."""
    from inference.loading.default_model import resolve_model
    from inference.loading.gguf_import import gguf_source
    if args.no_llama:
        return None
    if args.gguf or (args.model and args.model.endswith(".gguf")):
        return Path(args.gguf or args.model)
    return None if args.random else gguf_source(resolve_model(args.model))


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default=None,
                   help="random weights of a published shape instead of a checkpoint")
    p.add_argument("--users", type=int, nargs="+", default=[1, 8])
    p.add_argument("--tokens", type=int, default=64, help="new tokens per user")
    p.add_argument("--no-page", action="store_true", help="skip the page measurement")
    p.add_argument("--gradio-client", action="store_true",
                   help="page clients through gradio_client (more CPU on this machine) instead of raw HTTP")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every measurement, alternated")
    p.add_argument("--read-mib", type=int, default=1024, help="MiB summed to measure the read bandwidth before "
                   "each round (more than the last-level cache)")
    p.add_argument("--gguf", default=None, help="GGUF of the same model for llama.cpp (default: --model when it "
                   "is a .gguf, or the file the model was imported from)")
    p.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    p.add_argument("--vllm-url", default=None, help="a running vLLM server's /v1 URL, same model")
    p.add_argument("--vllm-model", default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    engine = (random_engine(args.random, args.device, args.dtype) if args.random else
              Engine.load(args.model, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products))
    # Closed (its scheduler's thread joined) before the interpreter ends: left running, it ended
    # once in "terminate called without an active exception" (exit 134) after the results were written.
    with engine:
        return measure(args, engine)


def measure(args, engine) -> int:
    gguf = model_gguf(args) if engine.device.type == "cpu" else None
    llamas, not_started = llama_peers(engine, gguf, args.users, args.tokens, Path(args.out))
    systems = {"engine": lambda n: engine_users(engine, n, args.tokens)}
    if not args.no_page:
        systems["page"] = lambda n: page_users(engine, n, args.tokens, args.gradio_client)
    for name, peer in llamas.items():
        systems[name] = lambda n, peer=peer: llama_users(peer, n)
    if args.vllm_url:
        systems["vllm"] = lambda n: vllm_users(args.vllm_url, args.vllm_model, n, args.tokens)
    for n in args.users:
        # Unmeasured first: each new shape's first pass pays one-time costs (kernel choice and
        # memory on a GPU) that would make the smaller counts look slower than they are.
        engine_users(engine, n, args.tokens)
    # Every user's text is compared with its prompt's text alone: ours with the engine's (the
    # page's too), llama.cpp's with its own (another engine's text may differ: ours must not).
    alone = {"engine": alone_texts(engine, max(args.users), args.tokens)}
    alone.update({"page": alone["engine"], **{name: peer.ready["alone"] for name, peer in llamas.items()}})
    # The bytes a step of n rows reads, each row at the runs' middle position: ours, and llama.cpp's on its file.
    context = round(statistics.mean(len(engine.prompt_ids(prompt(i))) for i in range(max(args.users)))) + args.tokens // 2
    reads = {"engine": roofline.engine_reads(engine, context)}
    reads.update({name: roofline.gguf_reads(gguf, engine.cfg, context) for name in llamas})
    # Round after round, every system at every count in turn: a drift of the machine's speed
    # hits them all alike, and each cell reports its median round.
    rounds: dict[str, dict[int, list[dict]]] = {system: {n: [] for n in args.users} for system in systems}
    for _ in range(args.rounds):
        read_gbs = roofline.read_bandwidth_gbs(engine.device, args.read_mib)  # beside this round: it drifts
        for n in args.users:
            for system, measure in systems.items():
                r = measure(n)
                texts = r.pop("texts")
                if system in alone:
                    r["same_as_alone"] = sum(t == alone[system][i] for i, t in enumerate(texts))
                if system in reads and r["step_ms"]:
                    r.update(read_gb_s=read_gbs, step_bytes=reads[system].at(n),
                             read_bound_fraction=roofline.fraction(reads[system].at(n), r["step_ms"], read_gbs))
                rounds[system][n].append(r)
                print(json.dumps({system: r}), file=sys.stderr)
    for peer in llamas.values():
        peer.close()
    rows = {system: {n: median_round(runs) for n, runs in by_n.items()} for system, by_n in rounds.items()}
    result = {"model": engine.name, "device": str(engine.device), "dtype": str(engine.dtype),
              "tokens": args.tokens, "rounds": args.rounds,
              "page_client": "gradio_client" if args.gradio_client else "bench/page_client.py",
              "ratios": ratios(rows, args.users), "systems": rows,
              "llama_cpp": {"builds": {name: {k: v for k, v in peer.ready.items() if k != "alone"}
                                       for name, peer in llamas.items()},
                            "not_started": not_started} if llamas or not_started else None}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"users-{args.random}" if args.random else "users"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    md = to_markdown(result)
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
