"""The shipped models decoding on their GGUF files' own blocks (the default): their probabilities
against transformers on the dequantized weights, within 1e-5 (slow: real models)."""

import json
from pathlib import Path

import pytest
import torch

from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine, Request
from helpers import hf_weights

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "smollm2_next_token.json"  # see data/README.md
PROMPTS = ["Water boils at a temperature of", "Once upon a time, a small robot", "1, 1, 2, 3, 5, 8,"]


def first_step_probs(engine: Engine, ids: list[int]) -> torch.Tensor:
    """The raw next-token distribution after ids through the engine's model (vocab,)."""
    with torch.inference_mode():
        return engine.model(torch.tensor([ids]), engine.model.new_cache(len(ids)), 0)[0].softmax(-1)


def test_smollm2_on_its_q4_1_blocks_matches_the_stored_transformers_reference():
    from inference.loading.default_model import default_model_dir
    d = default_model_dir()
    with Engine.from_hf_dir(d, device="cpu") as engine, Engine.from_hf_dir(d, device="cpu", dtype="float32") as f32:
        assert engine.model.quantized and engine.model.decode_step is not None and not f32.model.quantized
        worst = 0.0
        for case in json.loads(REFERENCE.read_text())["cases"]:
            events = list(engine.generate(Request(case["prompt"], SamplingParams(
                temperature=0.0, max_new_tokens=24), top_n=10)))
            first = {c.id: c.raw_prob for c in events[0].top}
            worst = max([worst] + [abs(first[r["id"]] - r["prob"]) for r in case["top10"]])
            assert [e.token_id for e in events[:-1]] == case["greedy_ids"], case["prompt"]
            # the same model as the float32 dequantized weights on our float32 path: within 1e-5
            ids = engine.tokenizer.encode(case["prompt"])
            assert (first_step_probs(engine, ids) - first_step_probs(f32, ids)).abs().max().item() <= 1e-5
    print(f"SmolLM2 on Q4_1 blocks: largest |p - transformers| over the top-10s: {worst:.2e}")
    # Seen: 1.51e-5, as on the float32 path (the same sums in the same order): transformers sums
    # in another order, and the reference is rounded to 1e-6.
    assert worst <= 2e-5


def test_gemma3_270m_on_its_q4_k_m_blocks_matches_transformers_on_the_dequantized_weights():
    from inference.loading.default_model import gemma_model_dir
    d = gemma_model_dir()
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, **hf_weights(d)).eval()
    with Engine.from_hf_dir(d, device="cpu") as engine:
        assert engine.model.quantized
        worst = 0.0
        for prompt in PROMPTS:
            ids = engine.tokenizer.encode(prompt)
            with torch.inference_mode():
                expected = ref(torch.tensor([ids])).logits[0, -1].float().softmax(-1)
            worst = max(worst, (first_step_probs(engine, ids) - expected).abs().max().item())
    print(f"Gemma 3 270M on its blocks: largest |p - transformers| over the vocabulary: {worst:.2e}")
    assert worst <= 1e-5
