"""The quantization lens on the shipped models: per precision, the KL divergence from float32, top-1
agreement, the fork step, bytes of weights per token and the decode speed, over the prompts in
bench/lens_prompts.json (inference/lenses/precisions.py: each precision made once, every prompt read).

    python -m bench.quantize_lens [--model default --model gemma3-270m] [--tokens 32]
        [--precisions float32,file,q8_0,q5_0,q4_1,q4_0]

Writes bench/results/quantize_lens.{md,json}. tok/s are each precision's greedy runs, one a prompt,
one after the other in one process: on a busy machine compare them within a run, as ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPTS = ROOT / "bench" / "lens_prompts.json"


def measure(model: str, prompts: list[str], precisions: str, tokens: int) -> dict:
    """Every precision's numbers on every prompt, and the lens's note on the source."""
    from inference.lenses.precisions import compare_prompts, source_note
    from inference.loading.default_model import resolve_model

    model_dir = resolve_model(None if model == "default" else model)
    t0 = time.perf_counter()
    out = {"model": model_dir.name, "note": source_note(model_dir), "precisions": []}
    for results in compare_prompts(model_dir, prompts, precisions, tokens):
        out["precisions"].append({
            "precision": results[0].precision, "types": results[0].types,
            "bytes_per_token": results[0].bytes_per_token,
            "prompts": [{**r.to_json(), "steps": [s.to_json() for s in r.steps], "text": r.text,
                         "reference_text": r.reference_text} for r in results]})
    out["seconds"] = time.perf_counter() - t0
    return out


def table(m: dict) -> list[str]:
    lines = [f"## {m['model']}", ""]
    if m["note"]:
        lines += [f"Note: {m['note']}.", ""]
    lines += ["| precision | matrices held | bytes of weights a token | decode tok/s (median; each prompt) | mean KL "
              "(nats) | max KL | top-1 agreement | fork step (each prompt) | perplexity of float32's text (mean) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for p in m["precisions"]:
        steps = [s for r in p["prompts"] for s in r["steps"]]
        kls = [s["kl"] for s in steps]
        rates = [r["decode_tokens_per_s"] for r in p["prompts"] if r["decode_tokens_per_s"] is not None]
        held = ", ".join(f"{t} {b / 2**20:.1f} MiB" for t, b in sorted(p["types"].items(), key=lambda kv: -kv[1]))
        forks = ", ".join("–" if r["fork_step"] is None else str(r["fork_step"]) for r in p["prompts"])
        lines.append(
            f"| {p['precision']} | {held} | {p['bytes_per_token'] / 2**20:.1f} MiB | "
            f"{statistics.median(rates):.1f} ({', '.join(f'{x:.1f}' for x in rates)}) | {statistics.mean(kls):.3g} | "
            f"{max(kls):.3g} | {sum(s['top1_agree'] for s in steps) / len(steps):.1%} | {forks} | "
            f"{statistics.mean(r['perplexity'] for r in p['prompts']):.3f} |")
    return lines + ["", f"({m['seconds']:.0f} s for this model: loading, quantizing and every run.)", ""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", help="a --model value; 'default' for SmolLM2")
    p.add_argument("--tokens", type=int, default=32, help="greedy tokens a prompt (default 32)")
    p.add_argument("--precisions", default="float32,file,q8_0,q5_0,q4_1,q4_0")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    prompts = json.loads(PROMPTS.read_text())["prompts"]
    models = [measure(m, prompts, args.precisions, args.tokens) for m in args.model or ["default", "gemma3-270m"]]
    import torch
    lines = ["# The quantization lens (`python -m bench.quantize_lens`)", "",
             f"{len(prompts)} prompts (bench/lens_prompts.json), {args.tokens} greedy tokens each; KL(float32 ‖ "
             "precision) of the next-token distributions with both fed float32's greedy text; top-1 agreement over "
             "those steps; the fork step: where the precision's own greedy text leaves float32's. "
             f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}.", ""]
    for m in models:
        lines += table(m)
    from bench.run import save
    save(args.out, "quantize_lens", models, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
