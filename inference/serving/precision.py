"""How far a reduced-precision decode path is from the float32 model, measured, so the page can
say by how much its numbers are approximate."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.sampling.params import SamplingParams

# Prompts of different kinds; their greedy continuations are the positions compared.
PROBE_PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, a tiny")
CANDIDATES = 50  # the most likely tokens compared at each step: more than the page shows


@dataclass(frozen=True)
class PrecisionReport:
    max_prob_diff: float  # largest |p - p_float32| over the top candidates of every step
    top1_agreement: float  # fraction of steps whose most likely token is float32's
    steps: int


def measure_decode_error(engine, steps: int = 16) -> PrecisionReport:
    """Greedy runs of PROBE_PROMPTS through the engine's own path (the scheduler: prefill, then
    decode steps), against one float32 forward over each whole sequence: every step's top
    CANDIDATES raw probabilities, and whether the most likely token is the same."""
    worst, agree, total = 0.0, 0, 0
    params = SamplingParams(temperature=0.0, max_new_tokens=steps, seed=0)
    for text in PROBE_PROMPTS:
        ids = engine.tokenizer.encode(text)
        events = [e for e in engine.generate_ids(ids, params, CANDIDATES) if hasattr(e, "top")]
        seq = ids + [e.token_id for e in events]
        with torch.inference_mode():
            # More than a few rows: every matmul reads the float32 weights (model.Linear).
            logits = engine.model(torch.tensor([seq], device=engine.device), engine.model.new_cache(len(seq)),
                                  0, all_logits=True)[0, len(ids) - 1:len(seq) - 1]
            ref = logits.float().softmax(-1).cpu()  # (steps, vocab)
        for e, row in zip(events, ref):
            worst = max(worst, max(abs(c.raw_prob - row[c.id].item()) for c in e.top))
            agree += int(e.top[0].id == int(row.argmax()))
            total += 1
    return PrecisionReport(worst, agree / total, total)
