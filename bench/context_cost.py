"""What a longer context costs a decode step: one greedy run of a few hundred to a thousand
tokens (the end-of-text tokens biased away, so it runs its length), its steps' times grouped by
the context they attended, and the attention kernel alone at those contexts for 1 and 8 rows in
the model's shapes: its keys and values read from memory (one pool per layer, as a step reads
them) and from the cache (one layer's pool every time). Where attention from memory runs far
below the read bandwidth, its loads wait on memory, not on arithmetic. Alternated in one run.

    python -m bench.context_cost [--model M] [--tokens 1000] [--rounds 3]

Writes bench/results/context_cost.{md,json}.
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

from bench import roofline  # noqa: E402
from bench.report import save  # noqa: E402
from inference.events import StepEvent  # noqa: E402
from inference.model import kernels  # noqa: E402
from inference.model.kv_cache import BLOCK_SIZE  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the sea."
SPAN = 128  # contexts grouped by spans of this many positions


def decode_by_context(engine: Engine, tokens: int) -> dict[int, float]:
    """Median step time (ms) of one greedy run's decode steps by the span of context each read."""
    ids = engine.prompt_ids(PROMPT)
    bias = " ".join(f"{i}:-100" for i in sorted(engine.eos_ids))
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens, logit_bias=bias)
    spans: dict[int, list[float]] = {}
    for ev in engine.generate_ids(ids, params, 10):
        if isinstance(ev, StepEvent) and ev.step > 0:  # step 0 holds the prefill
            spans.setdefault((len(ids) + ev.step) // SPAN * SPAN, []).append(ev.ms)
    return {s: statistics.median(v) for s, v in spans.items() if len(v) >= SPAN // 2}


def attention_ms(cfg, rows: int, context: int, resident: bool, reps: int = 15) -> float:
    """The attention of `rows` decode rows over `context` keys each, every layer of the model
    (kernels.attend: the kernel a decode step calls), in ms; resident: one layer's pool read
    every time (from the cache) instead of one pool per layer."""
    nb = -(-context // BLOCK_SIZE)
    slots = rows * nb * BLOCK_SIZE
    pools = 1 if resident else cfg.n_layers
    g = torch.Generator().manual_seed(0)
    ks = [torch.randn(slots, cfg.n_kv_heads, cfg.head_dim, generator=g) for _ in range(pools)]
    vs = [torch.randn(slots, cfg.n_kv_heads, cfg.head_dim, generator=g) for _ in range(pools)]
    blocks = torch.arange(rows * nb).view(rows, nb)  # (rows, nb): each row's blocks, in turn
    q = torch.randn(rows, cfg.n_heads, cfg.head_dim, generator=g)
    first = torch.zeros(rows, dtype=torch.int64)
    lengths = torch.full((rows,), context, dtype=torch.int64)
    scale = cfg.head_dim ** -0.5
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        for i in range(cfg.n_layers):
            kernels.attend(q, ks[i % pools], vs[i % pools], scale, first, lengths, blocks, BLOCK_SIZE, context)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times[1:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    args = ap.parse_args(argv)
    engine = Engine.load(args.model)
    cfg = engine.cfg
    with engine:
        if not kernels.available() or engine.device.type != "cpu":
            sys.exit("error: the attention kernel runs on a CPU with the kernels built")
        for _ in engine.generate_ids(engine.prompt_ids(PROMPT), SamplingParams(temperature=0.0, max_new_tokens=8)):
            pass  # unmeasured: the first step's one-time costs
        contexts = [SPAN // 2 + i * 3 * SPAN for i in range(1 + args.tokens // (3 * SPAN))]
        decode, att, reads = [], {}, []
        for _ in range(args.rounds):  # alternated: the machine's drift falls on every cell alike
            reads.append(roofline.read_bandwidth_gbs(engine.device, 1024))
            decode.append(decode_by_context(engine, args.tokens))
            for rows in (1, 8):
                for c in contexts:
                    for resident in (False, True):
                        att.setdefault(f"{rows},{c},{int(resident)}", []).append(attention_ms(cfg, rows, c, resident))
    spans = sorted(set.intersection(*(set(d) for d in decode)))
    step = {s: statistics.median(d[s] for d in decode) for s in spans}
    att_med = {k: statistics.median(v) for k, v in att.items()}
    gbs = statistics.median(reads)
    kv_bytes = lambda rows, c: rows * c * 2 * cfg.n_kv_heads * cfg.head_dim * 4 * cfg.n_layers  # noqa: E731
    lines = [f"# A decode step by its context ({args.model or 'default model'}; median of {args.rounds} rounds)", "",
             f"Read bandwidth beside the rounds: {gbs:.1f} GB/s (median of {', '.join(f'{r:.1f}' for r in reads)}).", "",
             "| context | decode step | tok/s |", "|---|---|---|"]
    lines += [f"| {s}-{s + SPAN - 1} | {step[s]:.2f} ms | {1000 / step[s]:.1f} |" for s in spans]
    lines += ["", f"Attention alone, all {cfg.n_layers} layers ({cfg.n_heads} heads, {cfg.n_kv_heads} kv heads of "
              f"{cfg.head_dim}; float32 keys and values):", "",
              "| rows | context | from memory | GB/s | from the cache | memory / cache |", "|---|---|---|---|---|---|"]
    for rows in (1, 8):
        for c in contexts:
            mem, res = att_med[f"{rows},{c},0"], att_med[f"{rows},{c},1"]
            lines.append(f"| {rows} | {c} | {mem:.2f} ms | {kv_bytes(rows, c) / mem / 1e6:.1f} | {res:.2f} ms | "
                         f"{mem / res:.2f}× |")
    md = "\n".join(lines) + "\n"
    save(Path(args.out), "context_cost", {"read_gbs": reads, "decode_ms": decode, "attention_ms": att}, md)


if __name__ == "__main__":
    main()
