"""Models side by side on this machine: each loaded in a process of its own, its memory and its
decode speed measured with bench/run.py's measure_engine, rounds alternated between models.

    python -m bench.models [--model default --model gemma3-270m] [--tokens 64] [--repeats 2]

Writes bench/results/models.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mib() -> float:
    """Resident memory now (not the peak): what the loaded model holds."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure_one(model: str, tokens: int) -> dict:
    """In this process: load `model`, then one round of measure_engine (after a warm-up)."""
    import torch

    from bench.run import measure_engine, peak_rss_mib
    from inference.loading.default_model import resolve_model
    from inference.serving.engine import Engine

    torch.set_grad_enabled(False)
    before = rss_mib()
    engine = Engine.from_hf_dir(resolve_model(None if model == "default" else model), "cpu", "float32")
    loaded = rss_mib() - before
    engine.eos_ids = set()  # every run decodes `tokens` tokens
    measure_engine(engine, 8, 10)  # unmeasured: first passes pay one-time costs
    out = measure_engine(engine, tokens, 10)
    p = engine.cfg.param_counts()["total"]
    out.update(model=engine.name, family=engine.cfg.family, params=p, loaded_mib=loaded,
               peak_rss_mib=peak_rss_mib(), kv_kib_per_token=engine.cfg.kv_bytes_per_token(4) / 1024)
    engine.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", help="a --model value; 'default' for SmolLM2")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process's model
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.tokens)))
        return 0
    models = args.model or ["default", "gemma3-270m"]
    rounds = {m: [] for m in models}
    for _ in range(args.repeats):  # alternated, so drift on a shared machine hits both alike
        for m in models:
            proc = subprocess.run([sys.executable, "-m", "bench.models", "--one", m, "--tokens", str(args.tokens)],
                                  cwd=ROOT, capture_output=True, text=True, check=True)
            rounds[m].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    lines = ["| model | family | parameters | memory after load | peak RSS | KV per token | TTFT 128 | "
             "TTFT 512 | decode tok/s | p50 ms | p95 ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, rs in rounds.items():
        best = max(rs, key=lambda r: r["decode_tok_s"])  # the round least disturbed by others
        lines.append(f"| {best['model']} | {best['family']} | {best['params'] / 1e6:.0f} M | "
                     f"{best['loaded_mib']:.0f} MiB | {best['peak_rss_mib']:.0f} MiB | "
                     f"{best['kv_kib_per_token']:.0f} KiB | {min(r['ttft_128_ms'] for r in rs):.0f} ms | "
                     f"{min(r['ttft_512_ms'] for r in rs):.0f} ms | "
                     f"{best['decode_tok_s']:.1f} (rounds: {', '.join('%.1f' % r['decode_tok_s'] for r in rs)}) | "
                     f"{best['p50_ms']:.1f} | {best['p95_ms']:.1f} |")
    md = "\n".join(lines) + "\n"
    from bench.report import save
    save(args.out, "models", rounds, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
