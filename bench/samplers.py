"""Per-step cost of the whole sampling pipeline with every stage on, against a decode step of
the same engine, measured in one process, alternating, so the ratio holds on a busy machine.

    python bench/samplers.py [--model ...] [--steps 40]    (writes bench/measured/<device>-samplers-<model>.md)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inference.factory import add_model_args  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from inference.sampling.state import RunState  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402
from inference.serving.step_stats import pick  # noqa: E402

EVERY = dict(temperature=0.9, top_k=200, top_p=0.97, min_p=0.005, repetition_penalty=1.1,
             presence_penalty=0.3, frequency_penalty=0.2, logit_bias="5:1.5, 6:-100", typical_p=0.98,
             epsilon_cutoff=1e-4, eta_cutoff=1e-4, top_n_sigma=4.0, dynatemp_range=0.3,
             xtc_probability=0.5, xtc_threshold=0.02, dry_multiplier=0.8, dry_allowed_length=1,
             mirostat_tau=6.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=512, help="tokens of context DRY searches")
    args = ap.parse_args()
    engine = Engine.load(args.model, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products)
    with engine:
        vocab = engine.cfg.vocab_size
        ids = engine.tokenizer.encode("The cat sat on the mat. " * 200)[:args.context]
        params = {"plain": SamplingParams(temperature=0.7), "every stage": SamplingParams(**EVERY)}
        decode = []  # ms per decode step of a real run (its first step, the prefill, left out)
        for ev in engine.generate_ids(ids[:64], SamplingParams(temperature=0.7, max_new_tokens=args.steps, seed=0), top_n=0):
            if hasattr(ev, "ms") and getattr(ev, "step", 0) > 0:
                decode.append(ev.ms)
        g = torch.Generator(device=engine.device).manual_seed(0)
        logits = torch.randn(vocab, device=engine.device, generator=g) * 3
        times = {k: [] for k in params}
        with torch.inference_mode():
            for i in range(4 * args.steps):
                name = list(params)[i % 2]
                state = RunState.at(params[name], ids, [], vocab, 0, tokenizer=engine.tokenizer, device=engine.device)
                t = time.perf_counter()
                pick(logits, params[name], state, g, 10)
                if engine.device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t) * 1000)
        step = statistics.median(decode)
        med = {k: statistics.median(v) for k, v in times.items()}
        dev = "h200" if engine.device.type == "cuda" else "cpu"
        lines = [f"# Sampling pipeline cost per step ({dev}, {engine.name}, vocab {vocab:,}, DRY over {len(ids)} tokens)", "",
                 "| sampling | median ms per step | share of a decode step |", "|---|---|---|"]
        lines += [f"| {k} | {v:.3f} | {v / step:.1%} |" for k, v in med.items()]
        lines += ["", f"Decode step (median of {len(decode)}, sampling included): {step:.2f} ms. "
                  f"Every stage on costs {med['every stage'] - med['plain']:.3f} ms more than plain sampling "
                  f"({(med['every stage'] - med['plain']) / step:.1%} of a decode step).",
                  "", "Settings: " + ", ".join(f"{k}={v}" for k, v in EVERY.items())]
        write_measured("samplers", engine, lines)


def write_measured(kind: str, engine, lines: list[str]) -> None:
    """Print the result and keep it as bench/measured/<device>-<kind>-<model>.md."""
    text = "\n".join(lines) + "\n"
    print(text)
    dev = "h200" if engine.device.type == "cuda" else "cpu"
    out = Path(__file__).parent / "measured" / f"{dev}-{kind}-{engine.name.lower().split('/')[-1]}.md"
    out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
