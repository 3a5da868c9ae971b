"""How far a reduced-precision decode path is from the float32 model, measured, so the page can
say by how much its numbers are approximate."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Prompts of different kinds; their greedy continuations are the positions compared.
PROBE_PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, a tiny")


@dataclass(frozen=True)
class PrecisionReport:
    max_prob_diff: float  # largest |p - p_float32| over every token of every step
    top1_agreement: float  # fraction of steps whose most likely token is float32's
    steps: int


def measure_decode_error(engine, steps: int = 16) -> PrecisionReport:
    """Teacher-forced on PROBE_PROMPTS and the decode path's own greedy continuation: the
    engine's decoder (prefill, then one decode step per token) against one float32 forward
    over the whole sequence, whose multi-row matmuls always use the float32 weights."""
    worst, agree, total = 0.0, 0, 0
    tok, decoder, dev = engine.tokenizer, engine.decoder, engine.device
    with torch.inference_mode():
        for text in PROBE_PROMPTS:
            ids = tok.encode(text)
            n0 = len(ids)
            cache = decoder.new_cache(n0 + steps)
            try:
                rows = [decoder.prefill(torch.tensor([ids], device=dev), cache)[0]]
                for _ in range(steps - 1):
                    ids.append(int(rows[-1].argmax()))
                    rows.append(decoder.step(torch.tensor([[ids[-1]]], device=dev), cache)[0])
            finally:
                decoder.release(cache)
            fast = torch.stack(rows).softmax(-1)  # (steps, vocab)
            ref_cache = engine.model.new_cache(len(ids))
            ref = engine.model(torch.tensor([ids], device=dev), ref_cache, 0, all_logits=True)[0, n0 - 1:]
            ref = ref.float().softmax(-1)  # (steps, vocab)
            worst = max(worst, (fast - ref).abs().max().item())
            agree += int((fast.argmax(-1) == ref.argmax(-1)).sum())
            total += fast.shape[0]
    return PrecisionReport(worst, agree / total, total)
