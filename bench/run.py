"""Token Lab's engine against its peers, measured in one run on the same machine and prompts.

    python -m bench.run [--model PATH] [--device auto] [--tokens 128] [--vllm-url URL]

Reports, ratios first: TTFT for 128- and 512-token prompts, decode tok/s with p50/p95 ms per
token, the cost of the per-step instrumentation, achieved GB/s against a copy bandwidth measured
in the same run, the step against the time its bytes take at the read bandwidth measured, peak
RSS; and the same for transformers generate() on the same weights and llama-cpp-python on the
same GGUF where installed, and a vLLM server given by --vllm-url; our command line's decode rate in
a process of its own (a checkpoint only). Writes bench/results/bench.{md,json}.
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

from bench import prompts  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402
from inference.model.arena import Arena  # noqa: E402
from inference.model.anatomy import decode_cost  # noqa: E402
from inference.factory import add_model_args  # noqa: E402
from inference.loading.gguf_import import gguf_source  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from inference.sampling.state import RunState  # noqa: E402
from inference.serving.step_stats import pick  # noqa: E402

def copy_bandwidth_gbs(device: torch.device, mib: int = 256) -> float:
    """Bytes moved (read + written) per second by a large tensor copy: the memory roofline."""
    a = torch.empty(mib * 2**20 // 4, device=device)
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    _sync(device)
    t = time.perf_counter()
    n = 10
    for _ in range(n):
        b.copy_(a)
    _sync(device)
    return 2 * a.numel() * 4 * n / (time.perf_counter() - t) / 1e9


def read_bandwidth_gbs(device: torch.device, mib: int = 1024) -> float:
    """Bytes read per second by summing a tensor larger than the CPU's last-level cache: what a
    decode step, which reads every weight once, can at best stream its weights at. On a CPU the
    tensor lies in memory as the weights do (an arena of 2 MiB pages, inference/model/arena.py),
    which two threads read ~1.6x faster than 4 KiB pages here."""
    n = mib * 2**20 // 4
    if device.type == "cpu":
        a = Arena(n * 4).empty((n,), torch.float32).fill_(1.0)
    else:
        a = torch.ones(n, device=device)
    a.sum()
    _sync(device)
    t = time.perf_counter()
    n = 5
    for _ in range(n):
        a.sum()
    _sync(device)
    return a.numel() * 4 * n / (time.perf_counter() - t) / 1e9


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


RANDOM_SHAPES = {  # Hugging Face config fields of models measured with random weights
    "llama-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
}


def random_engine(name: str, device: str, dtype: str) -> Engine:
    """An engine with random weights of a published shape, built on the device (no checkpoint)
    and a byte tokenizer: for speed measurements of models we cannot download."""
    from inference.model.config import ModelConfig
    from inference.device import resolve_device, resolve_dtype
    from inference.model.transformer import Transformer
    from inference.loading.tokenizer import Tokenizer

    cfg = ModelConfig.from_hf_dict(RANDOM_SHAPES[name])
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Transformer(cfg).state_dict().items()}
    state = {k: (torch.randn(shape, generator=g, device=dev, dtype=dt) * 0.02 if len(shape) == 2
                 else torch.ones(shape, device=dev, dtype=dt))
             for k, shape in shapes.items() if not (cfg.tie_word_embeddings and k == "output.weight")}
    model = Transformer.from_state_dict(cfg, state, dev, dt)
    table = [bytes([i % 256]) for i in range(cfg.vocab_size)]
    tok = Tokenizer(encode_fn=lambda text: list(text.encode("utf-8")), token_bytes=table,
                    raw_pieces=[t.decode("latin-1") for t in table], bos_id=None, eos_ids=(),
                    add_bos=False, special_tokens={}, chat_template=None, kind="bytes")
    return Engine(model, tok, f"{name} (random weights)")


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


class PeerProcess:
    """A peer in a process of its own, asked for one round at a time (so rounds alternate with
    ours): measured as it runs best, not beside our loaded engine. It prints one JSON line when
    ready, then one per "round" line it reads."""

    def __init__(self, cmd: list[str], what: str):
        import subprocess
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = json.loads(self.proc.stdout.readline() or "null")  # after its own warm-up
        if not self.ready:
            self.close()
            # A status below 0 is the signal that ended it (-11: a segmentation fault, as of the
            # native llama.cpp build on an Intel VM with AMX: bench/measured/cpu-quant-smollm2-135m.md).
            raise RuntimeError(f"the {what} peer did not start (it exited with status {self.proc.returncode}: "
                               f"run {' '.join(cmd)} to see why)")

    def measure(self) -> dict:
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def transformers_peer(model_dir: Path | None, tokens: int) -> PeerProcess | None:
    """transformers generate() on the same weights, float32 (bench/peer_transformers.py), or
    None without a checkpoint or without transformers installed."""
    if model_dir is None:
        return None
    import importlib.util
    if not importlib.util.find_spec("transformers"):
        return None
    return PeerProcess([sys.executable, "-m", "bench.peer_transformers", str(model_dir), str(tokens)], "transformers")


def llama_python() -> Path | None:
    """The Python of llama-cpp-python's own virtual environment (peer_llama_cpp.py), if built."""
    import os
    path = Path(os.environ.get("TOKEN_LAB_LLAMA_PYTHON") or Path.home() / ".cache/token-lab/llama-venv/bin/python")
    return path if path.exists() else None


def llama_cpp_peer(gguf: Path | None, engine: Engine, tokens: int, out_dir: Path) -> PeerProcess | None:
    """llama-cpp-python on the same GGUF file, the same prompt ids, greedy, as many threads as
    ours (bench/peer_llama_cpp.py), or None without a GGUF file or the peer's environment."""
    python = llama_python()
    if gguf is None or python is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    ids_file = out_dir / "llama-prompt-ids.json"
    ids_file.write_text(json.dumps({n: prompt_ids(engine, n) for n in (32, 128, 512)}))
    return PeerProcess([str(python), str(ROOT / "bench" / "peer_llama_cpp.py"), str(gguf), str(ids_file),
                        str(tokens), str(torch.get_num_threads())], "llama.cpp")


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
    for key in rounds[0]:
        values = [r[key] for r in rounds if r[key] is not None]
        out[key] = None if not values else min(values) if key.startswith("ttft") else statistics.median(values)
    return out


def measure_cli(model_dir: Path, device: str, dtype: str, prompt: str, tokens: int, top_n: int) -> dict:
    """Our command line as its users run it: `python -m inference generate --jsonl` in a process
    of its own (loading the model, then one run), decode tok/s from the arrival times of its step
    lines here, one line a token. A run ended early by an end-of-sequence token counts the steps
    it made."""
    import subprocess

    cmd = [sys.executable, "-m", "inference", "generate", "--model", str(model_dir), "--device", device,
           "--dtype", dtype, "--prompt", prompt, "--temperature", "0", "--max-new-tokens", str(tokens),
           "--top", str(max(top_n, 1)), "--jsonl"]
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
            "generated_tokens": summary["generated_tokens"], "prompt_tokens": summary["prompt_tokens"]}


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default=None,
                   help="measure random weights of a published shape instead of a checkpoint")
    p.add_argument("--tokens", type=int, default=128, help="decode tokens per run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--top", type=int, default=10, help="candidates per step when instrumented")
    p.add_argument("--gguf", default=None, help="GGUF of the same model for llama-cpp-python "
                   "(default: --model when it is a .gguf)")
    p.add_argument("--no-page", action="store_true", help="skip the page (gradio) measurement")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers peer")
    p.add_argument("--no-cli", action="store_true", help="skip our command line's own-process measurement")
    p.add_argument("--vllm-url", default=None, help="a running vLLM server's /v1 URL serving the same "
                   "weights in float32 (scripts/test_vllm.sh starts one): measured in turn with the others")
    p.add_argument("--vllm-model", default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)

    from inference.loading.default_model import resolve_model
    model_dir = None if args.random else resolve_model(args.model)
    engine = random_engine(args.random, args.device, args.dtype) if args.random else \
        Engine.from_hf_dir(model_dir, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products)
    info = engine.describe()
    device = engine.device
    copy_gbs, read_gbs = copy_bandwidth_gbs(device), read_bandwidth_gbs(device)
    rows = {}
    peer = transformers_peer(model_dir, args.tokens) if device.type == "cpu" and not args.no_transformers else None
    gguf = Path(args.gguf) if args.gguf else Path(args.model) if args.model and args.model.endswith(".gguf") \
        else gguf_source(model_dir) if model_dir is not None else None
    llama = llama_cpp_peer(gguf, engine, args.tokens, Path(args.out)) if device.type == "cpu" else None
    measure_engine(engine, args.tokens, args.top)  # unmeasured: first passes pay one-time costs
    rounds = {"ours": [], "bare": [], "cli": [], "peer": [], "vllm": [], "llama": []}
    # The command line reads the text of the same 32 prompt ids the engine's decode rows read.
    cli_prompt = engine.tokenizer.decode(prompt_ids(engine, 32)) if model_dir is not None and not args.no_cli else None
    reads = [read_gbs]  # the read bandwidth, measured again beside each of our rounds: it drifts
    for _ in range(args.repeats):  # one round of each system in turn
        reads.append(read_bandwidth_gbs(device))
        rounds["ours"].append(measure_engine(engine, args.tokens, args.top))
        rounds["bare"].append(measure_engine(engine, args.tokens, 0))
        if cli_prompt is not None:
            rounds["cli"].append(measure_cli(model_dir, args.device, args.dtype, cli_prompt, args.tokens, args.top))
        if peer is not None:
            rounds["peer"].append(peer.measure())
        if llama is not None:
            rounds["llama"].append(llama.measure())
        if args.vllm_url:
            rounds["vllm"].append(measure_vllm(args.vllm_url, args.vllm_model, engine, args.tokens, args.top))
    ours, bare = combine(rounds["ours"]), combine(rounds["bare"])
    ours["instrumentation_overhead_pct"] = 100 * (bare["decode_tok_s"] / ours["decode_tok_s"] - 1)
    ours["instrumentation_ms"] = pick_overhead_ms(engine, args.top)
    ours["instrumentation_direct_pct"] = 100 * ours["instrumentation_ms"] * bare["decode_tok_s"] / 1000
    # Weights read per decode step at the decode dtype's width, or as a GGUF file's blocks; the KV cache at the model's.
    bytes_per_token = decode_cost(engine.cfg, 32 + args.tokens // 2, info.decode_dtype.itemsize, engine.dtype.itemsize,
                                  info.stored_bytes).bytes
    ours["achieved_gb_s"] = bytes_per_token * ours["decode_tok_s"] / 1e9
    ours["roofline_fraction"] = ours["achieved_gb_s"] / copy_gbs  # copy_gbs counts bytes read + written
    # The step if it only read its bytes at the read bandwidth (the median of its measurements in
    # this run), and how many times that it takes.
    read_gbs = statistics.median(reads)
    ours["read_bound_ms"] = bytes_per_token / (read_gbs * 1e9) * 1000
    ours["times_read_bound"] = 1000 / ours["decode_tok_s"] / ours["read_bound_ms"]
    rows["token-lab"] = ours
    rows["token-lab (no instrumentation)"] = bare
    if rounds["cli"]:
        rows["token-lab CLI (generate --jsonl), own process"] = cli = combine(rounds["cli"])
    if peer is not None:
        rows["transformers generate() fp32, own process"] = combine(rounds["peer"])
        peer.close()
    if rounds["vllm"]:
        rows[f"vLLM server, top-{args.top} log-probabilities"] = combine(rounds["vllm"])
    page = measure_page(engine, args.tokens) if not args.no_page else None
    if page:
        ours["page_tok_s"], ours["page_engine_tok_s"] = page["tok_s"], page["engine_tok_s"]
        ours["page_fraction"] = page["fraction"]
    if llama is not None:
        rows[f"llama-cpp-python {llama.ready['version']} on {gguf.name}, own process"] = lcpp = combine(rounds["llama"])
        llama.close()
        ratios_llama = {"decode_vs_llama_cpp": ours["decode_tok_s"] / lcpp["decode_tok_s"],
                        "bare_decode_vs_llama_cpp": bare["decode_tok_s"] / lcpp["decode_tok_s"],
                        "ttft512_vs_llama_cpp": ours["ttft_512_ms"] / lcpp["ttft_512_ms"]}
        # alternated rounds: each round's ratio, so drift between rounds cancels
        ratios_llama["decode_vs_llama_cpp_by_round"] = [o["decode_tok_s"] / q["decode_tok_s"]
                                                        for o, q in zip(rounds["bare"], rounds["llama"])]
    else:
        ratios_llama = {}

    quality = vars(info.decode_error) if info.decode_error is not None else None

    base = rows.get("transformers generate() fp32, own process")
    ratios = dict(ratios_llama)
    if base:
        ratios["decode_vs_transformers"] = ours["decode_tok_s"] / base["decode_tok_s"]
        ratios["ttft512_vs_transformers"] = ours["ttft_512_ms"] / base["ttft_512_ms"]
        if rounds["cli"]:
            ratios["cli_decode_vs_transformers"] = cli["decode_tok_s"] / base["decode_tok_s"]
    if rounds["vllm"]:
        vllm = rows[f"vLLM server, top-{args.top} log-probabilities"]
        ratios["decode_vs_vllm"] = ours["decode_tok_s"] / vllm["decode_tok_s"]
        ratios["ttft512_vs_vllm"] = ours["ttft_512_ms"] / vllm["ttft_512_ms"]
        if rounds["cli"]:
            ratios["cli_decode_vs_vllm"] = cli["decode_tok_s"] / vllm["decode_tok_s"]
    result = {"model": engine.name, "device": str(device), "dtype": str(engine.dtype),
              "weights": "GGUF blocks" if info.stored_bytes else str(info.decode_dtype),
              "decode_dtype": str(info.decode_dtype), "copy_bandwidth_gb_s": copy_gbs,
              "read_bandwidth_gb_s": read_gbs, "read_bandwidth_samples_gb_s": reads,
              "bytes_read_per_token": bytes_per_token, "peak_rss_mib": peak_rss_mib(),
              "ratios": ratios, "systems": rows, "quality_guard": quality}
    md = to_markdown(result)
    save(args.out, f"bench-{args.random}" if args.random else "bench", result, md)
    return 0


def save(out_dir, stem: str, data, md: str) -> None:
    """Write a benchmark's results as out_dir/stem.json and .md, and print the markdown."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=2))
    (out / f"{stem}.md").write_text(md)
    print(md)


def to_markdown(r: dict) -> str:
    lines = [f"# Token Lab benchmark: {r['model']} on {r['device']} ({r['dtype']}, decode weights "
             f"{r.get('weights', r['decode_dtype'])})", ""]
    for k, v in r["ratios"].items():
        lines.append(f"- **{k}**: " + (", ".join(f"{x:.2f}×" for x in v) if isinstance(v, list) else f"{v:.2f}×"))
    lines += ["", "| system | TTFT 128 | TTFT 512 | decode tok/s | p50 ms | p95 ms |", "|---|---|---|---|---|---|"]
    for name, s in r["systems"].items():
        if s is None:
            lines.append(f"| {name} | not installed | | | | |")
            continue
        f = lambda v, fmt="{:.1f}": "–" if v is None else fmt.format(v)  # noqa: E731
        lines.append(f"| {name} | {f(s['ttft_128_ms'], '{:.0f} ms')} | {f(s['ttft_512_ms'], '{:.0f} ms')} | "
                     f"{f(s['decode_tok_s'])} | {f(s['p50_ms'])} | {f(s['p95_ms'])} |")
    ours = r["systems"]["token-lab"]
    lines += ["", f"- instrumentation overhead (top-N, raw and final probabilities, entropy, rank, stored "
                  f"logits, KV stats): {ours['instrumentation_ms']:.2f} ms a step timed directly = "
                  f"{ours['instrumentation_direct_pct']:.1f}% of a decode step; end to end "
                  f"{ours['instrumentation_overhead_pct']:.1f}% (noisy)",
              f"- bytes read per decode token: {r['bytes_read_per_token'] / 2**20:.0f} MiB; achieved "
              f"{ours['achieved_gb_s']:.1f} GB/s = {100 * ours['roofline_fraction']:.0f}% of the copy "
              f"bandwidth measured in this run ({r['copy_bandwidth_gb_s']:.1f} GB/s read + written); at the read "
              f"bandwidth measured ({r['read_bandwidth_gb_s']:.1f} GB/s, a sum over 1 GiB; the median of "
              f"{len(r['read_bandwidth_samples_gb_s'])} measurements in this run, "
              f"{min(r['read_bandwidth_samples_gb_s']):.1f}-{max(r['read_bandwidth_samples_gb_s']):.1f}) those bytes take "
              f"{ours['read_bound_ms']:.1f} ms: a decode step takes {ours['times_read_bound']:.2f}× that",
              f"- peak RSS: {r['peak_rss_mib']:.0f} MiB"]
    if "page_tok_s" in ours:
        lines.append(f"- the page (bench/page_client.py streaming from the real app) receives {ours['page_tok_s']:.1f} "
                     f"tok/s = {100 * ours['page_fraction']:.0f}% of the engine's decode rate alone on the same "
                     f"prompt ({ours['page_engine_tok_s']:.1f} tok/s; runs alternated, medians)")
    q = r.get("quality_guard")
    if q:
        lines.append(f"- quality guard vs float32: top-1 equal on {100 * q['top1_agreement']:.1f}% of "
                     f"{q['steps']} steps; largest probability difference {q['max_prob_diff']:.4f}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
