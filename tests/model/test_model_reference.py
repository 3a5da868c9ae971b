"""Our model against transformers' LlamaForCausalLM on the same random weights (float32)."""

import pytest
import torch

import helpers
from inference.serving.engine import Engine
from tiny_models import CONFIGS

transformers = pytest.importorskip("transformers")

TOL = 1e-4


def hf_reference(model_dir):
    return helpers.hf_reference(model_dir, attn_implementation="eager")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_and_cached_decode_match_transformers(tiny_dirs, name):
    engine = Engine.from_hf_dir(tiny_dirs[name], device="cpu", dtype="float32")
    ref = hf_reference(tiny_dirs[name])
    torch.manual_seed(0)
    ids = torch.randint(3, engine.cfg.vocab_size, (1, 40))
    with torch.inference_mode():
        expected = ref(ids).logits[0]  # (T, vocab), a full forward without cache

        model = engine.model
        cache = model.new_cache(40)
        n_prompt = 24
        prefill = model(ids[:, :n_prompt], cache, 0, all_logits=True)[0]
        diffs = [(prefill - expected[:n_prompt]).abs().max().item()]
        for pos in range(n_prompt, 40):  # one cached decode step per position
            step = model(ids[:, pos:pos + 1], cache, pos)[0]
            diffs.append((step - expected[pos]).abs().max().item())
        # Our own forward without cache agrees with our cached decode, too.
        full = model(ids, model.new_cache(40), 0, all_logits=True)[0]
    print(f"{name}: max |logit diff| vs transformers {max(diffs):.2e}")
    assert max(diffs) <= TOL, f"{name}: max |diff| {max(diffs):.2e}"
    assert (full - expected).abs().max().item() <= TOL
    assert expected.abs().max() > 0.5  # the comparison is not between near-zero logits


def test_chunked_prefill_after_cache_matches_transformers(tiny_dirs):
    """A multi-token chunk after cached positions uses the explicit causal mask."""
    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    ref = hf_reference(tiny_dirs["gqa_tied"])
    ids = torch.randint(3, engine.cfg.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = ref(ids).logits[0]
        cache = engine.model.new_cache(30)
        engine.model(ids[:, :10], cache, 0)
        chunk = engine.model(ids[:, 10:], cache, 10, all_logits=True)[0]
    assert (chunk - expected[10:]).abs().max().item() <= TOL


def test_rope_scaling_changes_the_output(tiny_dirs):
    """The llama3-scaled model would differ from an unscaled one: the test above has teeth."""
    import json
    from inference.model.config import ModelConfig
    from inference.model.rope import rope_inv_freq
    cfg = json.loads((tiny_dirs["llama3_rope"] / "config.json").read_text())
    scaled = rope_inv_freq(ModelConfig.from_hf_dict(cfg))
    plain = rope_inv_freq(ModelConfig.from_hf_dict({**cfg, "rope_scaling": None}))
    assert not torch.allclose(scaled, plain)


def test_low_precision_decode_weights_apply_to_single_rows_only(tiny_dirs):
    """decode_dtype keeps prefill in float32 and moves one-row matmuls to bfloat16 copies."""
    exact = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    fast = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32", decode_dtype="bfloat16")
    assert fast.model.decode_dtype == torch.bfloat16 and exact.model.decode_dtype == torch.float32
    ids = torch.randint(3, exact.cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        a = exact.model(ids, exact.model.new_cache(21), 0, all_logits=True)
        cache = fast.model.new_cache(21)
        b = fast.model(ids, cache, 0, all_logits=True)
        assert torch.equal(a, b)  # prefill over many rows: float32 weights, bit for bit
        step_exact = exact.model(ids[:, :1], exact.model.new_cache(1), 0)
        step_fast = fast.model(ids[:, :1], fast.model.new_cache(1), 0)
    diff = (step_fast - step_exact).abs().max().item()
    assert 0 < diff < 0.05  # bfloat16 weights: close, and really used
