"""Per-step cost of a constraint (xgrammar's mask of allowed tokens) against a decode step of the
same engine: the matcher's work per token (take the token, fill the next mask), the stage and the
masked-mass statistics in sampling, and whole decode steps of a constrained and a free run. One
process, alternating, so the ratios hold on a busy machine.

    python bench/constrain.py [--model ...] [--steps 48]    (writes bench/measured/<device>-constrain-<model>.md)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inference.factory import add_model_args  # noqa: E402
from inference.sampling import constrain  # noqa: E402
from inference.sampling.params import SamplingParams  # noqa: E402
from inference.sampling.state import RunState  # noqa: E402
from inference.serving.engine import Engine  # noqa: E402
from inference.serving.step_stats import pick  # noqa: E402
from bench.samplers import write_measured  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "year", "tags", "summary"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
                         "summary": {"type": "string"}}}
PROMPT = "Describe a famous book as JSON with its name, year, tags and a summary."


def decode_ms(engine, ids, params) -> list[float]:
    """ms of each decode step of a real run (its first step, the prefill, left out)."""
    return [ev.ms for ev in engine.generate_ids(ids, params, top_n=10) if getattr(ev, "step", 0) > 0 and hasattr(ev, "ms")]


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    engine = Engine.load(args.model, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products)
    text = json.dumps(SCHEMA)
    with engine:
        vocab, tok = engine.cfg.vocab_size, engine.tokenizer
        ids = engine.prompt_ids(PROMPT, chat=True)
        t = time.perf_counter()
        constrain.check("json_schema", "{}")  # imports xgrammar
        constrain._compiler(tok, vocab)  # the vocabulary's preprocessing, once per model
        vocab_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        constrain.compile_constraint("json_schema", text, tok, vocab)
        compile_first = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        constrain.compile_constraint("json_schema", text, tok, vocab)
        compile_again = (time.perf_counter() - t) * 1000
        free = SamplingParams(temperature=1.0, seed=0, max_new_tokens=args.steps)
        bound = SamplingParams(temperature=1.0, seed=0, max_new_tokens=args.steps, constraint="json_schema",
                               constraint_text=text)
        # Whole decode steps, alternating runs: a free run and a constrained one.
        steps = {"free": [], "constrained": []}
        for i in range(4):  # alternating which goes first
            for name in (("free", "constrained") if i % 2 == 0 else ("constrained", "free")):
                steps[name] += decode_ms(engine, ids, free if name == "free" else bound)
        # The tokens a constrained run took: the matcher's work along them.
        tokens = [ev.token_id for ev in engine.generate_ids(ids, bound, top_n=0) if hasattr(ev, "token_id")]
        accept = []
        for _ in range(3):
            m = constrain.matcher("json_schema", text, tok, vocab, [])
            for token in tokens[:-1]:  # the last (end of sequence) ends the matcher: no mask after it
                t = time.perf_counter()
                m.accept(token)
                accept.append((time.perf_counter() - t) * 1000)
        # Sampling one step with the stage and its statistics, against the same step free.
        logits = engine.step_logits(ids + tokens[:5])
        states = {"free": RunState.at(free, ids, tokens[:5], vocab, 0, tokenizer=tok),
                  "constrained": RunState.at(bound, ids, tokens[:5], vocab, 0, tokenizer=tok)}
        params = {"free": free, "constrained": bound}
        sampling = {k: [] for k in params}
        g = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            for i in range(4 * args.steps):
                name = list(params)[i % 2]
                t = time.perf_counter()
                pick(logits, params[name], states[name], g, 10)
                sampling[name].append((time.perf_counter() - t) * 1000)
    med = statistics.median
    step, step_c = med(steps["free"]), med(steps["constrained"])
    mask = med(accept)
    extra = med(sampling["constrained"]) - med(sampling["free"])
    dev = "h200" if engine.device.type == "cuda" else "cpu"
    lines = [f"# Cost of a constraint per step ({dev}, {engine.name}, vocab {vocab:,}, xgrammar)", "",
             "| what | median ms | share of a free decode step |", "|---|---|---|",
             f"| decode step, free run (sampling included) | {step:.2f} | 100% |",
             f"| decode step, run under the JSON schema | {step_c:.2f} | {step_c / step:.1%} |",
             f"| matcher: take the token, fill the next mask (bitmask → bool over the vocabulary) | {mask:.3f} | {mask / step:.1%} |",
             f"| sampling: the stage and the masked-mass statistics, more than free sampling | {extra:.3f} | {extra / step:.1%} |",
             "",
             f"Mask per step (matcher + stage + statistics): {mask + extra:.3f} ms, {(mask + extra) / step:.1%} of a "
             f"decode step. Decode steps: {len(steps['free'])} free, {len(steps['constrained'])} constrained; "
             f"matcher: {len(accept)} tokens; sampling: {len(sampling['free'])} steps each.",
             f"Compiling the schema: {compile_first:.1f} ms the first time, {compile_again:.3f} ms from the cache "
             f"(importing xgrammar and reading the vocabulary, once per process and model: {vocab_ms:.0f} ms).",
             "A whole decode step includes the machine's noise (it is shared); the matcher and sampling rows "
             "are measured alone.",
             "", "Schema: `" + json.dumps(SCHEMA) + "`"]
    write_measured("constrain", engine, lines)


if __name__ == "__main__":
    main()
