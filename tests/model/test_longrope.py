"""LongRoPE and partial rotary embeddings (Phi-3.5-mini, Phi-4-mini) past what the families' own
tests check (tests/model/test_families.py, tests/loading/test_gguf_families.py: every path within
1e-4 of transformers): the context capped at the original one, where transformers' every forward
pass takes the short factors, and a prompt past it refused naming the bound; the configs Microsoft
ships read as transformers reads them; what cannot be computed refused in one line."""

import dataclasses
import math

import pytest
import torch

from inference.errors import InputError, ModelError
from inference.model.anatomy import family_path
from inference.model.config import ModelConfig
from inference.model.rope import rope_attention_factor, rope_inv_freq
from inference.request import prepare_run
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine
from tiny_families import make_family_model

transformers = pytest.importorskip("transformers")

SHORT, LONG = [1.0, 1.2, 1.5, 1.9, 2.4, 3.0], [1.0, 2.0, 3.5, 6.0, 10.0, 17.0]
# Phi-4-mini's config.json as shipped (transformers < 5's form), at the tiny shape; Phi-3.5-mini's
# is the same without partial_rotary_factor.
SHIPPED = dict(model_type="phi3", vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               original_max_position_embeddings=64, partial_rotary_factor=0.75, rope_theta=10000.0,
               rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
               bos_token_id=1, eos_token_id=2, pad_token_id=0, sliding_window=None)


def top10_gap(ours: torch.Tensor, ref: torch.Tensor) -> float:
    p, q = ours.softmax(-1), ref.softmax(-1)
    top = q.topk(10, dim=-1).indices
    return (p.gather(-1, top) - q.gather(-1, top)).abs().max().item()


@pytest.mark.parametrize("family", ["phi3_longrope", "phi4_mini"])
def test_the_context_is_the_original_one_and_a_prompt_past_it_is_refused(tmp_path, sp_model_bytes, family):
    """A model of 256 positions trained on 64: its whole 64 positions within 1e-4 of transformers
    (one pass of 64 takes the short factors); at 65 transformers takes the long ones for every
    position, so the first 64 change (the numbers of a position would depend on how the text was
    cut into passes): a prompt that leaves no room in 64 is refused, naming the window."""
    d, ref = make_family_model(tmp_path, family, sp_model_bytes)
    ref.config._attn_implementation = "eager"
    ids = torch.randint(5, 370, (1, 65), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected, longer = ref(input_ids=ids[:, :64]).logits[0], ref(input_ids=ids).logits[0, :64]
    assert (expected.softmax(-1) - longer.softmax(-1)).abs().max().item() > 1e-3
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as engine:
        assert (engine.cfg.max_seq_len, ref.config.max_position_embeddings) == (64, 256)
        with torch.inference_mode():
            ours = engine.model(ids[:, :64], engine.model.new_cache(64), 0, all_logits=True)[0]
        assert top10_gap(ours, expected) <= 1e-4
        with pytest.raises(InputError, match=r"^the prompt is \d+ tokens but the context window is 64; "):
            prepare_run(engine, SamplingParams(max_new_tokens=1), prompt=" ".join(["the"] * 64))
        path = " / ".join(family_path(engine.cfg))
    assert "LongRoPE's short factors (the context capped at the original 64)" in path
    assert ("on each head's first 12 of 16 dims" in path) == (family == "phi4_mini")


def test_the_configs_microsoft_ships_read_as_transformers_reads_them():
    """Phi-4-mini's config.json (rope_scaling with "type", top-level partial_rotary_factor and
    original context; "su", Phi-3-mini-128k's older name) reads as transformers' own saved form;
    the config we write back reads as the same again, and transformers reads from it the
    frequencies (12 of 16 dims, short factors) and attention factor we compute."""
    shipped = ModelConfig.from_hf_dict(SHIPPED)
    saved = ModelConfig.from_hf_dict({"model_type": "phi3", **transformers.Phi3Config(
        **{k: v for k, v in SHIPPED.items() if k != "model_type"}).to_dict()})
    su = ModelConfig.from_hf_dict({**SHIPPED, "rope_scaling": {**SHIPPED["rope_scaling"], "type": "su"}})
    assert shipped == saved == su
    assert (shipped.rotary_dim, shipped.max_seq_len, shipped.features()) == (12, 64, {"rope_scaled", "partial_rotary"})
    written = shipped.to_hf_dict()
    assert ModelConfig.from_hf_dict(written) == dataclasses.replace(shipped, explicit_head_dim=16)  # written out
    theirs = transformers.Phi3Config(**{k: v for k, v in written.items() if k != "model_type"})
    rotary = transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(theirs)
    assert torch.allclose(rope_inv_freq(shipped), rotary.inv_freq, rtol=1e-6, atol=0)
    assert rope_attention_factor(shipped) == pytest.approx(rotary.attention_scaling, rel=1e-12)
    assert rope_attention_factor(shipped) == pytest.approx(math.sqrt(1 + math.log(256 / 64) / math.log(64)), rel=1e-12)


@pytest.mark.parametrize("changes, message", [
    (dict(model_type="llama", rope_scaling=None), r"^config: partial rotary embeddings \(partial_rotary_factor\) "
                                                  r"are not supported for llama$"),
    (dict(rope_scaling={"type": "longrope", "short_factor": SHORT[:4], "long_factor": LONG[:4]}),
     r"^config: LongRoPE needs 6 short and long factors \(one per frequency\), got 4 and 4$"),
    (dict(partial_rotary_factor=0.35, rope_scaling=None),  # int(16 * 0.35) = 5 dims: no pairs
     r"^config: RoPE must turn an even number of a head's 16 dims, got 5$"),
    (dict(rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "rope_type": "longrope"},
          model_type="gemma3_text", rope_parameters=None, head_dim=16, partial_rotary_factor=1.0),
     r"^config: LongRoPE on gemma3 is not supported$"),
])
def test_what_cannot_be_computed_is_refused_in_one_line(changes, message):
    with pytest.raises(ModelError, match=message):
        ModelConfig.from_hf_dict({**SHIPPED, **changes})
