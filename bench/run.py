"""Token Lab's engine against its peers, measured in one run on the same machine and prompts.

    python -m bench.run [--model PATH] [--device auto] [--tokens 128] [--vllm-url URL]

Reports, ratios first: TTFT for 128- and 512-token prompts, decode tok/s with p50/p95 ms per
token, the cost of the per-step instrumentation, achieved GB/s against a copy bandwidth measured
in the same run, peak RSS; the fraction of its read-bound time a step reaches (its bytes at the
read bandwidth measured beside each round, against the round's step) for one row and for --rows
runs at once; and the same for transformers generate() on the same weights, llama.cpp on the
same GGUF in the builds at hand (bench/peers.py: native, and a portable build for time to first
token where given), and a vLLM server given by --vllm-url; our command line's decode rate in a
process of its own. Writes bench/results/bench.{md,json} (--model FILE.gguf: bench-FILE.*).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import prompts, roofline  # noqa: E402
from bench.report import save, to_markdown  # noqa: E402
from bench.peers import describe, start_llama_builds, transformers_peer  # noqa: E402
from bench.roofline import copy_bandwidth_gbs, read_bandwidth_gbs, sync as _sync  # noqa: E402
from bench.shapes import RANDOM_SHAPES, random_engine  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402
from inference.factory import add_model_args  # noqa: E402
from inference.loading.gguf_import import gguf_source  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from inference.sampling.state import RunState  # noqa: E402
from inference.serving.step_stats import pick  # noqa: E402


def prompt_ids(engine: Engine, n: int) -> list[int]:
    return prompts.prompt_ids(engine.tokenizer, n)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def measure_engine(engine: Engine, tokens: int, top_n: int, repeats: int = 1) -> dict:
    """Our engine: TTFT at 128/512 prompt tokens; decode step times with instrumentation top_n
    (a run may end early at an end-of-sequence token: step times are averaged)."""
    out = {}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=1)
    for n in (128, 512):
        ids = prompt_ids(engine, n)
        ttfts = []
        for _ in range(repeats):
            events = list(engine.generate_ids(ids, greedy, top_n))
            ttfts.append(events[-1].ttft_ms)
        out[f"ttft_{n}_ms"] = min(ttfts)
    ids = prompt_ids(engine, 32)
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    step_ms = []
    for _ in range(repeats):
        events = list(engine.generate_ids(ids, params, top_n))
        step_ms += [e.ms for e in events[1:-1]]
    out["decode_tok_s"] = 1000 / statistics.mean(step_ms)
    out["p50_ms"], out["p95_ms"] = pct(step_ms, 50), pct(step_ms, 95)
    return out


def pick_overhead_ms(engine: Engine, top_n: int, n: int = 300) -> float:
    """Extra milliseconds the per-step instrumentation adds to sampling, timed directly on the
    same logits with and without it, alternating (end-to-end step times are too noisy here)."""
    g = torch.Generator(device=engine.device).manual_seed(0)
    logits = torch.randn(engine.cfg.vocab_size, device=engine.device, generator=g) * 3
    params = SamplingParams(temperature=0.7)
    state = RunState.at(params, [], [], engine.cfg.vocab_size, device=engine.device)
    times = {0: [], top_n: []}
    with torch.inference_mode():
        for i in range(2 * n):
            k = top_n if i % 2 else 0
            t = time.perf_counter()
            pick(logits, params, state, g, k)
            _sync(engine.device)
            times[k].append(time.perf_counter() - t)
    return 1000 * (statistics.median(times[top_n]) - statistics.median(times[0]))


def llama_cpp_peers(gguf: Path | None, engine: Engine, tokens: int, out_dir: Path) -> tuple[dict, dict]:
    """llama.cpp on the same GGUF file, the same prompt ids, greedy, as many threads as ours
    (bench/peer_llama_cpp.py), in every build at hand: ({build: peer}, {build: why it did not
    start}); none without a GGUF file or a build."""
    if gguf is None:
        return {}, {}
    out_dir.mkdir(parents=True, exist_ok=True)
    ids_file = out_dir / "llama-prompt-ids.json"
    ids_file.write_text(json.dumps({n: prompt_ids(engine, n) for n in (32, 128, 512)}))
    return start_llama_builds("peer_llama_cpp.py", [gguf, ids_file, tokens, torch.get_num_threads()])


def measure_vllm(url: str, model: str | None, tokenizer_engine: Engine, tokens: int, top_n: int) -> dict:
    """A running vLLM server (OpenAI API) on the same weights, the same prompt ids and top_n
    log-probabilities a step: TTFT of a 1-token completion, decode from the streamed chunks'
    arrival times (one chunk a token)."""
    import httpx

    base = url.rstrip("/")
    model = model or httpx.get(f"{base}/models", timeout=30).json()["data"][0]["id"]

    def run(ids, new) -> list[float]:
        body = {"model": model, "prompt": ids, "max_tokens": new, "min_tokens": new, "temperature": 0.0,
                "stream": True, "logprobs": top_n}
        t0 = time.perf_counter()
        arrivals = []
        with httpx.stream("POST", f"{base}/completions", json=body, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    got = len((json.loads(line[6:])["choices"][0].get("logprobs") or {}).get("tokens") or [])
                    arrivals += [time.perf_counter() - t0] * got
        return arrivals

    out = {f"ttft_{n}_ms": 1000 * run(prompt_ids(tokenizer_engine, n), 1)[0] for n in (128, 512)}
    arrivals = run(prompt_ids(tokenizer_engine, 32), tokens)
    step_ms = [1000 * (b - a) for a, b in zip(arrivals, arrivals[1:])]
    out["decode_tok_s"] = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    out["p50_ms"], out["p95_ms"] = pct(step_ms, 50), pct(step_ms, 95)
    return out


def combine(rounds: list[dict]) -> dict:
    """Rounds measured in turn with the peers (so drift hits all alike): best TTFT, median rest."""
    out = {}
    for key, first in rounds[0].items():
        values = [r[key] for r in rounds if r[key] is not None]
        out[key] = (first if isinstance(first, str) else None if not values  # (a string: what made it)
                    else min(values) if key.startswith("ttft") else statistics.median(values))
    return out


def measure_cli(model: Path | str, device: str, dtype: str, prompt: str, tokens: int, top_n: int,
                products: str = "auto") -> dict:
    """Our command line as its users run it: `python -m inference generate --jsonl` in a process
    of its own (loading the model, then one run), decode tok/s from the arrival times of its step
    lines here, one line a token. A run ended early by an end-of-sequence token counts the steps
    it made. `model`: a checkpoint's folder or a GGUF file, as --model takes it."""
    import subprocess

    cmd = [sys.executable, "-m", "inference", "generate", "--model", str(model), "--device", device,
           "--dtype", dtype, "--products", products, "--prompt", prompt, "--temperature", "0",
           "--max-new-tokens", str(tokens), "--top", str(max(top_n, 1)), "--jsonl"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    arrivals, summary = [], None
    for line in proc.stdout:
        t = time.perf_counter()
        event = json.loads(line)
        if "token_id" in event and "reason" not in event:
            arrivals.append(t)
        else:
            summary = event
    err = proc.stderr.read()
    if proc.wait() != 0 or summary is None or len(arrivals) < 2:
        raise RuntimeError(f"the CLI run failed: {err.strip()[-500:]}")
    return {"ttft_128_ms": None, "ttft_512_ms": None, "p50_ms": None, "p95_ms": None,
            "decode_tok_s": (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]), "tokens": len(arrivals),
            "generated_tokens": summary["generated_tokens"], "prompt_tokens": summary["prompt_tokens"],
            "products": (summary.get("products") or {}).get("path")}  # a quantized model's: integer or float32


def measure_page(engine: Engine, tokens: int, rounds: int = 3) -> dict:
    """Tokens per second as a page receives them: the real app, streamed to a page client in
    another process (bench/page_client.py, as a browser would be), alternated with the engine
    alone on the same prompt and settings so that the machine's drift hits both; medians of
    `rounds` each."""
    import subprocess

    from ui.controls import Controls
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui

    c = Controls(prompt=prompts.FILLER, temperature=0.0, max_new_tokens=tokens, seed="1")
    ids = engine.prompt_ids(c.prompt)
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    demo = build_ui(engine, Handlers(engine))
    _, url, _ = serve(demo, engine, block=False)
    page, alone, received = [], [], []
    try:
        for _ in range(rounds):
            proc = subprocess.run([sys.executable, "-m", "bench.page_client", url, json.dumps(c.values())],
                                  cwd=ROOT, capture_output=True, text=True, timeout=600)
            arrivals = json.loads(proc.stdout.strip().splitlines()[-1])["arrivals"]
            (t0, n0), (t1, n1) = next(a for a in arrivals if a[1] > 0), arrivals[-1]
            page.append((n1 - n0) / (t1 - t0))
            received.append(n1)
            alone.append(list(engine.generate_ids(ids, params, 10))[-1].decode_tokens_per_s)
    finally:
        demo.close()
    return {"tok_s": statistics.median(page), "engine_tok_s": statistics.median(alone),
            "fraction": statistics.median(page) / statistics.median(alone), "rounds": rounds,
            "tokens_received": received}


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default=None,
                   help="measure random weights of a published shape instead of a checkpoint")
    p.add_argument("--tokens", type=int, default=128, help="decode tokens per run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--top", type=int, default=10, help="candidates per step when instrumented")
    p.add_argument("--rows", type=int, default=8, help="also this many runs at once (bench.users' prompts), "
                   "for the step's fraction of its read-bound time at that many rows (0: not measured)")
    p.add_argument("--read-mib", type=int, default=1024, help="MiB summed to measure the read bandwidth (more "
                   "than the last-level cache)")
    p.add_argument("--gguf", default=None, help="GGUF of the same model for llama-cpp-python "
                   "(default: --model when it is a .gguf)")
    p.add_argument("--no-page", action="store_true", help="skip the page (gradio) measurement")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers peer")
    p.add_argument("--no-cli", action="store_true", help="skip our command line's own-process measurement")
    p.add_argument("--vllm-url", default=None, help="a running vLLM server's /v1 URL serving the same "
                   "weights in float32 (scripts/test_vllm.sh starts one): measured in turn with the others")
    p.add_argument("--vllm-model", default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    from bench.users import engine_users, prompt

    args = parse(argv)
    from inference.loading.default_model import resolve_model
    model_dir = None if args.random else resolve_model(args.model)
    engine = random_engine(args.random, args.device, args.dtype) if args.random else \
        Engine.from_hf_dir(model_dir, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products)
    info = engine.describe()
    device = engine.device
    copy_gbs, read_gbs = copy_bandwidth_gbs(device), read_bandwidth_gbs(device, args.read_mib)
    rows = {}
    peer = transformers_peer(model_dir, args.tokens) if device.type == "cpu" and not args.no_transformers else None
    given_gguf = args.model if args.model and args.model.endswith(".gguf") else None
    gguf = Path(args.gguf) if args.gguf else Path(given_gguf) if given_gguf \
        else gguf_source(model_dir) if model_dir is not None else None
    llamas, not_started = llama_cpp_peers(gguf, engine, args.tokens, Path(args.out)) if device.type == "cpu" else ({}, {})
    measure_engine(engine, args.tokens, args.top)  # unmeasured: first passes pay one-time costs
    if args.rows > 1:
        engine_users(engine, args.rows, args.tokens, args.top)
    rounds = {"ours": [], "bare": [], "cli": [], "peer": [], "vllm": [], "rows": [], **{b: [] for b in llamas}}
    # The command line reads the text of the same 32 prompt ids the engine's decode rows read.
    cli_prompt = engine.tokenizer.decode(prompt_ids(engine, 32)) if model_dir is not None and not args.no_cli else None
    reads = [read_gbs]  # the read bandwidth, measured again beside each round: it drifts
    for _ in range(args.repeats):  # one round of each system in turn
        reads.append(read_bandwidth_gbs(device, args.read_mib))
        rounds["ours"].append(measure_engine(engine, args.tokens, args.top))
        rounds["bare"].append(measure_engine(engine, args.tokens, 0))
        if args.rows > 1:
            rounds["rows"].append(engine_users(engine, args.rows, args.tokens, args.top))
        if cli_prompt is not None:
            rounds["cli"].append(measure_cli(given_gguf or model_dir, args.device, args.dtype, cli_prompt,
                                             args.tokens, args.top, args.products))
        if peer is not None:
            rounds["peer"].append(peer.measure())
        for build, llama in llamas.items():
            rounds[build].append(llama.measure())
        if args.vllm_url:
            rounds["vllm"].append(measure_vllm(args.vllm_url, args.vllm_model, engine, args.tokens, args.top))
    ours, bare = combine(rounds["ours"]), combine(rounds["bare"])
    ours["instrumentation_overhead_pct"] = 100 * (bare["decode_tok_s"] / ours["decode_tok_s"] - 1)
    ours["instrumentation_ms"] = pick_overhead_ms(engine, args.top)
    ours["instrumentation_direct_pct"] = 100 * ours["instrumentation_ms"] * bare["decode_tok_s"] / 1000
    # Weights read per decode step at the decode dtype's width, or as a GGUF file's blocks; the KV cache at the model's.
    context = 32 + args.tokens // 2  # the run's middle position
    reads_one = roofline.engine_reads(engine, context)
    bytes_per_token = reads_one.at(1)
    ours["achieved_gb_s"] = bytes_per_token * ours["decode_tok_s"] / 1e9
    ours["roofline_fraction"] = ours["achieved_gb_s"] / copy_gbs  # copy_gbs counts bytes read + written
    # The step if it only read its bytes at the read bandwidth (the median of its measurements in
    # this run), and how many times that it takes.
    read_gbs = statistics.median(reads)
    ours["read_bound_ms"] = bytes_per_token / (read_gbs * 1e9) * 1000
    ours["times_read_bound"] = 1000 / ours["decode_tok_s"] / ours["read_bound_ms"]
    rows["token-lab"] = ours
    rows["token-lab (no instrumentation)"] = bare
    # Each round's step against the read bandwidth measured beside that round (reads[0] came before them all).
    bound = {name: {"rows": 1, **roofline.by_round(bytes_per_token, [1000 / r["decode_tok_s"] for r in rounds[key]], reads[1:])}
             for name, key in (("token-lab", "ours"), ("token-lab (no instrumentation)", "bare"),
                               ("token-lab CLI", "cli")) if rounds[key]}
    if rounds["rows"]:
        n = args.rows
        context_n = round(statistics.mean(len(engine.prompt_ids(prompt(i))) for i in range(n))) + args.tokens // 2
        bound[f"token-lab, {n} runs at once"] = {
            "rows": n, "aggregate_tok_s": statistics.median(r["aggregate_tok_s"] for r in rounds["rows"]),
            **roofline.by_round(roofline.engine_reads(engine, context_n).at(n), [r["step_ms"] for r in rounds["rows"]], reads[1:])}
    if rounds["cli"]:
        rows["token-lab CLI (generate --jsonl), own process"] = combine(rounds["cli"])
    if peer is not None:
        rows["transformers generate() fp32, own process"] = combine(rounds["peer"])
        peer.close()
    if rounds["vllm"]:
        rows[f"vLLM server, top-{args.top} log-probabilities"] = combine(rounds["vllm"])
    page = measure_page(engine, args.tokens) if not args.no_page else None
    if page:
        ours["page_tok_s"], ours["page_engine_tok_s"] = page["tok_s"], page["engine_tok_s"]
        ours["page_fraction"] = page["fraction"]
    ratios, llama_cpp = {}, None
    if llamas:
        lcpp = {build: combine(rounds[build]) for build in llamas}
        for build, llama in llamas.items():
            rows[f"{describe(llama.ready)} on {gguf.name}, own process"] = lcpp[build]
            bound[f"llama.cpp {build}"] = {"rows": 1, **roofline.by_round(
                roofline.gguf_reads(gguf, engine.cfg, context).at(1),
                [1000 / r["decode_tok_s"] for r in rounds[build]], reads[1:])}
            llama.close()
        llama_cpp = llama_figures(llamas, lcpp, not_started)
        ratios.update(llama_ratios(llama_cpp, ours, bare, rows.get("token-lab CLI (generate --jsonl), own process"),
                                   lcpp, rounds))
    ratios.update(other_ratios(rows, ours, args.top))
    result = {"model": engine.name, "device": str(device), "dtype": str(engine.dtype),
              "weights": "GGUF blocks" if info.stored_bytes else str(info.decode_dtype),
              "decode_dtype": str(info.decode_dtype), "copy_bandwidth_gb_s": copy_gbs,
              "read_bandwidth_gb_s": read_gbs, "read_bandwidth_samples_gb_s": reads, "read_mib": args.read_mib,
              "bytes_read_per_token": bytes_per_token, "peak_rss_mib": peak_rss_mib(),
              "ratios": ratios, "systems": rows, "read_bound": bound, "llama_cpp": llama_cpp,
              "products": info.products, "quality_guard": vars(info.decode_error) if info.decode_error is not None else None}
    stem = f"bench-{args.random}" if args.random else f"bench-{Path(given_gguf).stem}" if given_gguf else "bench"
    save(args.out, stem, result, to_markdown(result))
    return 0


def llama_figures(llamas: dict, combined: dict, not_started: dict) -> dict:
    """Which llama.cpp build each of its figures comes from: decode from the native build where
    it runs; time to first token from the fastest build that evaluated its prompt batched (none:
    no TTFT compared); every build's version, CPU features and prompt feeding."""
    batched = [b for b, llama in llamas.items() if llama.ready["prompt"] == "batched"]
    return {"decode_from": "native" if "native" in llamas else next(iter(llamas)),
            "ttft_from": min(batched, key=lambda b: combined[b]["ttft_512_ms"]) if batched else None,
            "builds": {b: llama.ready for b, llama in llamas.items()}, "not_started": not_started}


def llama_ratios(figures: dict, ours: dict, bare: dict, cli: dict | None, lcpp: dict, rounds: dict) -> dict:
    decode = lcpp[figures["decode_from"]]
    out = {"decode_vs_llama_cpp": ours["decode_tok_s"] / decode["decode_tok_s"],
           "bare_decode_vs_llama_cpp": bare["decode_tok_s"] / decode["decode_tok_s"]}
    if cli:
        out["cli_decode_vs_llama_cpp"] = cli["decode_tok_s"] / decode["decode_tok_s"]
    if figures["ttft_from"]:
        out["ttft512_vs_llama_cpp"] = ours["ttft_512_ms"] / lcpp[figures["ttft_from"]]["ttft_512_ms"]
    # alternated rounds: each round's ratio, so drift between rounds cancels
    out["decode_vs_llama_cpp_by_round"] = [o["decode_tok_s"] / q["decode_tok_s"]
                                           for o, q in zip(rounds["bare"], rounds[figures["decode_from"]])]
    if cli:
        out["cli_decode_vs_llama_cpp_by_round"] = [o["decode_tok_s"] / q["decode_tok_s"]
                                                   for o, q in zip(rounds["cli"], rounds[figures["decode_from"]])]
    return out


def other_ratios(rows: dict, ours: dict, top: int) -> dict:
    out = {}
    cli = rows.get("token-lab CLI (generate --jsonl), own process")
    for peer, key in (("transformers generate() fp32, own process", "transformers"),
                      (f"vLLM server, top-{top} log-probabilities", "vllm")):
        base = rows.get(peer)
        if base:
            out[f"decode_vs_{key}"] = ours["decode_tok_s"] / base["decode_tok_s"]
            out[f"ttft512_vs_{key}"] = ours["ttft_512_ms"] / base["ttft_512_ms"]
            if cli:
                out[f"cli_decode_vs_{key}"] = cli["decode_tok_s"] / base["decode_tok_s"]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
