"""What one more row costs a step's products: every quantized matrix of a model (its layers and
LM head, as one decode step reads them) multiplied by 1, 2, 4, 8 and 16 activation rows, with the
integer products and with the float32 products on the same blocks, alternated in one run. The
step's products cost a + b·rows: `a` is what a step pays once (reading the weights, unpacking
their planes), `b` what each row adds (on the integer path its three int8 slices' dot products).
Where b is large beside a, eight rows cost far more than one, whatever the rest of the step.
Beside it, the least b can be on this CPU: a row's `vpdpbusd` instructions at the rate
`bench.vnni_peak` measures.
(Python calls each matrix here; a decode step calls the kernels once, so `a` is lower there.)

    python -m bench.row_cost [--model M] [--rounds 5]

Writes bench/results/row_cost.{md,json}.
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

from bench.report import save  # noqa: E402
from bench.vnni_peak import vnni_rate  # noqa: E402
from inference.model.layers import Linear  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402

ROWS = (1, 2, 4, 8, 16)


def step_products_ms(weights, rows: int, reps: int = 5) -> float:
    """The median time of one pass of x (rows, in) through every weight, in ms."""
    xs = {w.in_features: torch.randn(rows, w.in_features, generator=torch.Generator().manual_seed(0))
          for w in weights}
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        for w in weights:
            w.matmul(xs[w.in_features])
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times[1:])


def quant_weights(engine: Engine) -> list:
    return [m.qweight for m in engine.model.modules() if isinstance(m, Linear) and m.qweight is not None]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    args = ap.parse_args(argv)
    paths = {p: quant_weights(Engine.load(args.model, products=p)) for p in ("integer", "float32")}
    runs = {p: {r: [] for r in ROWS} for p in paths}
    for _ in range(args.rounds):  # alternated: the machine's drift falls on both alike
        for r in ROWS:
            for p, ws in paths.items():
                runs[p][r].append(step_products_ms(ws, r))
    med = {p: {r: statistics.median(v) for r, v in by.items()} for p, by in runs.items()}
    lines = [f"# A step's products by its rows ({args.model or 'default model'}; median of {args.rounds} rounds)", "",
             "| products | " + " | ".join(f"{r} rows" for r in ROWS) + " | per added row (1→8) | 8 rows / 1 row |",
             "|---|" + "---|" * (len(ROWS) + 2)]
    for p, m in med.items():
        lines.append(f"| {p} | " + " | ".join(f"{m[r]:.2f} ms" for r in ROWS)
                     + f" | {(m[8] - m[1]) / 7:.3f} ms | {m[8] / m[1]:.2f}× |")
    # The floor under a row's integer products: its vpdpbusd instructions (for each of 3 slices,
    # one per 4 inputs and 16 outputs: 64 byte products) at the rate this CPU runs them, measured here.
    weights = sum(w.in_features * w.out_features for w in paths["integer"])
    rate = vnni_rate(torch.get_num_threads())
    floor_ms = 1000 * 3 * weights / 64 / rate if rate else None
    if rate:
        lines += ["", f"A row's integer products are {3 * weights / 64 / 1e6:.1f} M `vpdpbusd` (3 slices, "
                  f"{weights / 1e6:.1f} M weights). On {torch.get_num_threads()} threads this CPU ran "
                  f"{rate / 1e9:.2f} G a second (`bench.vnni_peak`, after the rounds): at least "
                  f"{floor_ms:.3f} ms a row, against {(med['integer'][8] - med['integer'][1]) / 7:.3f} ms "
                  "measured per added row."]
    md = "\n".join(lines) + "\n"
    save(Path(args.out), "row_cost", {"rows": list(ROWS), "median_ms": med, "runs_ms": runs,
                                      "vpdpbusd_per_s": rate, "row_floor_ms": floor_ms}, md)


if __name__ == "__main__":
    main()
