"""Speculative decoding's speed against plain decoding, each drafter, measured in one process on
the same prompts, alternating plain and speculative runs so that the ratio holds on a busy machine.
Greedy decoding: each speculative text is checked equal to the plain one, token for token.

    python bench/speculative.py [--model ...] [--tokens 64] [--repeats 3] [--draft-tokens 4]
    (writes bench/measured/<device>-speculative-<model>.md)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from inference.factory import add_model_args  # noqa: E402
from inference.decoding.drafters import make_drafter  # noqa: E402
from inference.decoding.speculative import SpecDoneEvent, SpecStepEvent, Speculator, timed  # noqa: E402
from inference.events import StepEvent  # noqa: E402
from inference.request import prepare_run  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402

PROMPTS = {
    # Text that repeats what it read (a copy task): prompt lookup's best case.
    "copy": "Copy the list.\nList: apples, pears, plums, figs, dates, limes, kiwis, grapes, melons, "
            "cherries, peaches, lemons.\nCopy: apples, pears, plums, figs, dates, limes,",
    # Prose that continues on its own.
    "prose": "The history of the printing press begins in the fifteenth century, when",
}


def plain(engine, request) -> tuple[list[int], float]:
    """A plain greedy run through the scheduler: its tokens and its decode tokens per second
    (from the first token to the last, as the speculative runs are timed)."""
    steps, rate, _ = timed(engine.run(request), StepEvent)
    return [e.token_id for e in steps], rate


class NoProposals:
    """A drafter that proposes nothing: each round is one plain step on the speculative path
    (contiguous caches on the caller's thread), to tell that path's cost from the method's."""
    name = "none"

    def propose(self, ids, k, params, generator):
        return []


def speculative(engine, request, spec: str, k: int, draft) -> tuple[list[int], float, SpecDoneEvent]:
    drafter = NoProposals() if spec == "none" else \
        make_drafter(spec, engine, len(request.ids) + request.max_new + k + 1, lambda name: draft)
    steps, rate, done = timed(Speculator(engine, drafter, k).run(request), SpecStepEvent)
    return [e.token_id for e in steps], rate, done


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--early-exit", type=int, nargs="+", default=[8, 16])
    args = ap.parse_args()
    with Engine.load(args.model, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products) as engine:
        engine.eos_ids = set()  # every run makes --tokens tokens: the rates compare like with like
        info = engine.describe()
        drafters = ["none", "prompt-lookup", *(f"early-exit:{n}" for n in args.early_exit), "model:self"]
        rows = []
        for name, prompt in PROMPTS.items():
            request = prepare_run(engine, {"temperature": 0, "max_new_tokens": args.tokens}, prompt=prompt, top_n=5)
            plain(engine, request)  # warm-up
            rates = {d: [] for d in ["plain", *drafters]}
            stats = {}
            for _ in range(args.repeats):
                ref, rate = plain(engine, request)
                rates["plain"].append(rate)
                for d in drafters:
                    tokens, rate, done = speculative(engine, request, d, args.draft_tokens, engine)
                    assert tokens == ref, f"{d} on {name}: the greedy text differs from plain decoding's"
                    rates[d].append(rate)
                    stats[d] = done
            base = statistics.median(rates["plain"])
            rows.append((name, "plain (scheduler)", base, 1.0, None, None))
            for d in drafters:
                done = stats[d]
                r = statistics.median(rates[d])
                rows.append((name, d, r, r / base, done.acceptance_rate, done.generated_tokens / done.rounds))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    weights = "its GGUF file's blocks" if info.stored_bytes else str(info.dtype).removeprefix("torch.")
    lines = [f"# Speculative decoding against plain decoding ({info.where}, {info.name}, {weights})",
             "", "| prompt | decoding | decode tok/s (median) | speed-up | acceptance | tokens per target pass |",
             "|---|---|---|---|---|---|"]
    for name, d, r, up, acc, per in rows:
        lines.append(f"| {name} | {d} | {r:.1f} | {up:.2f}x | {'' if acc is None else f'{acc:.0%}'} | "
                     f"{'' if per is None else f'{per:.2f}'} |")
    lines += ["", f"Greedy, {args.tokens} new tokens, {args.draft_tokens} proposals a round, median of "
              f"{args.repeats} alternating runs; every speculative text equal to plain decoding's, token for token. "
              "model:self drafts with the target itself (every proposal accepted: the mechanism's cost "
              "without a smaller model; no second model with SmolLM2's tokenizer is on this machine). "
              "Plain runs go through the scheduler; speculative runs through the same paged step on the caller's "
              "thread, a round's rows as decode rows of one sequence: `none` is that path with no proposals "
              "(one plain step a round). The early exits' proposals run the first layers layer by layer.",
              f"Machine: {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}; commit {commit}."]
    kind = "blocks" if info.stored_bytes else str(info.dtype).removeprefix("torch.")
    name = info.name.lower().replace("-instruct", "")
    out = ROOT / "bench" / "measured" / f"{info.where.split(':')[0]}-speculative-{name}-{kind}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
