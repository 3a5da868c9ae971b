"""`python -m inference quantize-compare`: the quantization lens's flags and what it prints (with
--jsonl each precision's step lines as it is done, then a line per precision; else a table, the
texts where they fork, and the lens's note on stderr). inference/cli.py adds it beside the others."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from inference.errors import InputError

if TYPE_CHECKING:
    from inference.lenses.precisions import PrecisionResult


def add_parser(sub, model_help: str) -> argparse.ArgumentParser:
    q = sub.add_parser("quantize-compare", help="the model at several precisions on one prompt: per step the KL "
                                                "divergence from float32, top-1 agreement and rank; the fork step, "
                                                "bytes per token, tok/s and perplexity per precision")
    q.add_argument("--model", default=None, help=model_help)
    q.add_argument("--prompt", required=True)
    q.add_argument("--chat", action="store_true", help="render the prompt with the chat template")
    q.add_argument("--precisions", default="float32,q8_0,q4_0", metavar="P,P,...",
                   help="float32 (the reference, always measured), q8_0, q5_0, q4_1, q4_0 (every weight matrix "
                        "quantized by gguf's quantizer, as llama.cpp's --pure), file (a GGUF source's own blocks) "
                        "or a .gguf file of the same model (default float32,q8_0,q4_0)")
    q.add_argument("--max-new-tokens", type=int, default=32, help="greedy tokens of float32's text (default 32)")
    q.add_argument("--products", default="auto", choices=("auto", "integer", "float32"),
                   help="the quantized precisions' products on the CPU (as generate's --products)")
    q.add_argument("--jsonl", action="store_true",
                   help="a JSON object per precision and step, then one per precision (else a table)")
    return q


def run(args) -> int:
    # torch and the engine are imported once the command runs, not for the CLI's --help.
    from inference.lenses.precisions import compare, source_note
    from inference.loading.default_model import resolve_model

    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    model_dir = resolve_model(args.model)
    note = source_note(model_dir)
    if note:
        print(f"note: {note}", file=sys.stderr)
    results = []
    for r in compare(model_dir, args.prompt, args.precisions, args.max_new_tokens, chat=args.chat,
                     products=args.products):
        results.append(r)
        if args.jsonl:
            for row in r.steps:
                print(json.dumps(row.to_json()), flush=True)
        else:
            print(f"[{r.precision}: done]", file=sys.stderr, flush=True)
    if args.jsonl:
        for r in results:
            print(json.dumps(r.to_json()), flush=True)
    else:
        print("\n".join(table(results)))
    return 0


def table(results: list[PrecisionResult]) -> list[str]:
    """A row per precision (float32's first), then float32's text and each text that forks."""
    lines = [f"{'precision':<16} {'bytes/token':>12} {'tok/s':>8} {'perplexity':>10} {'mean KL':>9} {'max KL':>9} "
             f"{'top-1 agree':>11} {'fork step':>9}"]
    for r in results:
        kls = [s.kl for s in r.steps]
        agree = sum(s.top1_agree for s in r.steps) / len(r.steps)
        rate = f"{r.decode_tokens_per_s:.1f}" if r.decode_tokens_per_s is not None else "–"
        lines.append(f"{r.precision:<16} {r.bytes_per_token:>12,} {rate:>8} {r.perplexity:>10.3f} "
                     f"{sum(kls) / len(kls):>9.2e} {max(kls):>9.2e} {agree:>11.0%} "
                     f"{'–' if r.fork_step is None else r.fork_step:>9}")
    lines.append(f"\nfloat32: {results[0].text!r}")
    lines += [f"{r.precision} forks at step {r.fork_step}: {r.text!r}" for r in results[1:] if r.fork_step is not None]
    return lines
