"""Our CPU kernels against torch's operators, in one run on this machine: each of SmolLM2's
product shapes at 1 row (ours, MKL's mv on column-major weights, oneDNN's copy) and several rows
(ours against oneDNN), and a decode step of the real model in one call, through the layers with
the kernels and with torch's operators alone (runs alternated), beside the read bandwidth
measured in the same run.

    python -m bench.kernels [--tokens 48] [--rounds 4]

Writes bench/results/kernels.{md,json}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import prompts  # noqa: E402
from bench.report import save  # noqa: E402
from bench.roofline import read_bandwidth_gbs  # noqa: E402
from inference.model import kernels  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402

SHAPES = {"wqkv": (960, 576), "wo": (576, 576), "w13": (3072, 576), "w2": (576, 1536), "head": (49152, 576)}


def timed(fn, reps: int = 15) -> float:
    """Median seconds of fn over reps calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def products() -> list[dict]:
    """GB/s of weight read per product: 30 copies of each layer shape (more than the caches
    hold), the head once."""
    rows_out = []
    for name, (out, inn) in SHAPES.items():
        n = 1 if name == "head" else 30
        ws = [torch.randn(out, inn) for _ in range(n)]
        cols = [w.t().contiguous().t() for w in ws]
        dnn = [torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in ws]
        nbytes = out * inn * 4 * n
        for r in (1, 2, 4, 8, 16):
            x = torch.randn(r, inn)
            row = {"shape": name, "rows": r}
            if r == 1:
                row["ours"] = nbytes / timed(lambda: [kernels.gemv(w, x[0]) for w in ws]) / 1e9
                row["mkl_mv"] = nbytes / timed(lambda: [torch.mv(w, x[0]) for w in cols]) / 1e9
            else:
                row["ours"] = nbytes / timed(lambda: [kernels.gemm_rows(w, x) for w in ws]) / 1e9
            row["onednn"] = nbytes / timed(lambda: [torch.ops.mkldnn._linear_pointwise(x, d, None, "none", [], "")
                                                    for d in dnn]) / 1e9
            rows_out.append(row)
    return rows_out


def decode_steps(tokens: int, rounds: int) -> dict:
    """Median decode step (ms) of SmolLM2 alternated between three paths: the whole step in one
    call (decode_step.py), the layers through the kernels, torch's operators alone."""
    from inference.loading.default_model import resolve_model
    model_dir = resolve_model(None)
    with_kernels = Engine.from_hf_dir(model_dir, "cpu", "float32")
    one_call = with_kernels.model.decode_step
    real = kernels._library
    kernels._library = lambda: None  # the second engine: torch's operators and layouts alone
    without = Engine.from_hf_dir(model_dir, "cpu", "float32")
    ids = prompts.prompt_ids(with_kernels.tokenizer, 32)
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    paths = (("one call", with_kernels, real, one_call), ("layers, kernels", with_kernels, real, None),
             ("torch", without, lambda: None, None))
    steps = {name: [] for name, *_ in paths}
    try:
        for _ in range(rounds + 1):
            for name, engine, lib, step in paths:
                kernels._library, engine.model.decode_step = lib, step
                events = list(engine.generate_ids(ids, params, 10))
                steps[name].append([e.ms for e in events[1:-1]])
    finally:
        kernels._library, with_kernels.model.decode_step = real, one_call
    return {name: statistics.median([ms for run in runs[1:] for ms in run]) for name, runs in steps.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    if not kernels.available():
        print("the kernels are not built here (no C compiler?)")
        return 1
    read_gbs = read_bandwidth_gbs(torch.device("cpu"))
    table = products()
    step = decode_steps(args.tokens, args.rounds)
    layer = sum(o * i for name, (o, i) in SHAPES.items() if name != "head")
    weights = (30 * layer + SHAPES["head"][0] * SHAPES["head"][1]) * 4  # bytes of matrices a step reads
    bound_ms = weights / (read_gbs * 1e9) * 1000
    result = {"read_bandwidth_gb_s": read_gbs, "products": table, "decode_step_ms": step,
              "weights_bytes": weights, "read_bound_ms": bound_ms}
    lines = [f"# CPU kernels against torch's operators ({torch.get_num_threads()} threads)", "",
             f"Read bandwidth in this run: {read_gbs:.1f} GB/s; SmolLM2's {weights / 2**20:.0f} MiB of "
             f"matrices take {bound_ms:.1f} ms at it.", "",
             "| decode step (SmolLM2, 1 run) | median ms | × read bound |", "|---|---|---|"]
    lines += [f"| {name} | {ms:.1f} | {ms / bound_ms:.2f}× |" for name, ms in step.items()]
    lines += ["", "GB/s of weight read per product (30 copies of each layer's matrix; the head once):", "",
              "| shape | rows | ours | MKL mv | oneDNN |", "|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {r['rows']} | {r['ours']:.1f} | {r.get('mkl_mv', float('nan')):.1f} | {r['onednn']:.1f} |"
              for r in table]
    md = "\n".join(lines) + "\n"
    save(args.out, "kernels", result, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
