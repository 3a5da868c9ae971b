"""The quantization lens's independent reference (tests/lenses, tests/page/test_lens_page.py):
gguf's own blocks of a Hugging Face matrix, transformers' float32 model on the original weights or
on those blocks dequantized, and transformers' own greedy runs."""

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize


def blocks(w: torch.Tensor, name: str) -> np.ndarray:
    """gguf's blocks of a Hugging Face matrix (rows, bytes a row)."""
    return quantize(w.float().numpy(), gguf.GGMLQuantizationType[name.upper()]).view(np.uint8).reshape(w.shape[0], -1)


def hf_model(model_dir, name: str | None):
    """transformers' float32 model on the original weights, or on gguf's dequantized blocks of
    every matrix (embedding and head included) in type `name`."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if name is not None:
        qtype = gguf.GGMLQuantizationType[name.upper()]
        with torch.no_grad():
            for p in ref.parameters():
                if p.dim() == 2:  # a tied head is the embedding's parameter: once
                    p.copy_(torch.from_numpy(dequantize(blocks(p, name), qtype).reshape(p.shape)))
    return ref


def greedy(ref, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def log_probs_along(ref, ids: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' next-token log-probabilities in float64 at each of `tokens`' steps after `ids`
    (steps, vocab)."""
    with torch.no_grad():
        logits = ref(torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1].double()
    return logits.log_softmax(-1)
