"""A family is one spec every path reads: every field of ModelConfig that changes a token's path is
a named feature, every forward path names every feature (computes it, or lacks it), and a model
needing a feature a path lacks never takes that path."""

import dataclasses

import pytest

from inference.errors import ModelError
from inference.model import kernels
from inference.model.config import ModelConfig, RopeScaling
from inference.model.family_spec import FEATURES, PATHS, SPECS, missing, require

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, n_layers=2, n_heads=4, n_kv_heads=2)
# Fields that size or name the model, not turns of its path.
NOT_TURNS = {*SHAPE, "max_seq_len", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "explicit_head_dim",
             "bos_token_id", "eos_token_ids", "family", "head_dim", "n_rep"}
# Each turn's field set off its default, and the feature it must then report.
TURNS = {
    "qkv_bias": (True, "qkv_bias"), "qk_norm": (True, "qk_norm"), "qk_norm_full": (True, "qk_norm_full"),
    "pre_norms": (False, "no_pre_norms"), "post_norms": (True, "post_norms"),
    "norm_unit_offset": (True, "norm_unit_offset"), "activation": ("gelu_tanh", "gelu"),
    "embed_scale": (2.0, "embed_scale"), "query_pre_attn_scalar": (24.0, "attn_scale"),
    "attention_multiplier": (0.2, "attn_scale"), "attn_logit_softcap": (50.0, "attn_softcap"),
    "final_logit_softcap": (30.0, "final_softcap"), "logit_scale": (2.5, "logit_scale"),
    "residual_multiplier": (0.5, "residual_scale"), "sliding_window": (8, None),
    "layer_types": (("sliding", "full"), "sliding_window"), "local_rope_theta": (10_000.0, "local_rope_theta"),
    "nope_layers": ((1,), "nope_layers"), "rope_scaling": (RopeScaling("linear", 2.0), "rope_scaled"),
    "partial_rotary_dim": (4, "partial_rotary"),
}


def test_every_field_that_turns_the_path_is_a_feature():
    """A field added to ModelConfig must be listed here with the feature it turns on (and that
    feature named in FEATURES and by every path), or named as not a turn."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert fields - NOT_TURNS == set(TURNS), "a new ModelConfig field: name its feature in family_spec.FEATURES"
    base = ModelConfig(**SHAPE)
    assert base.features() == frozenset()
    for name, (value, feature) in TURNS.items():
        extra = {"sliding_window": 8} if name == "layer_types" else {}
        if feature is None:  # a window alone, with no sliding layer, turns nothing
            assert ModelConfig(**SHAPE, **{name: value}).features() == frozenset()
            continue
        assert ModelConfig(**SHAPE, **extra, **{name: value}).features() == {feature}, name
    assert {f for _, f in TURNS.values() if f} == set(FEATURES)


def test_every_path_names_every_feature_and_every_spec_uses_named_ones():
    for path, (computes, lacks) in PATHS.items():
        assert not computes & lacks, path
        assert computes | lacks == set(FEATURES), f"{path} does not name {set(FEATURES) - computes - lacks}"
    for spec in SPECS.values():
        assert spec.features() | spec.may <= set(FEATURES), spec.name


def test_a_path_lacking_a_feature_refuses_in_one_line():
    assert missing("DecodeStep", frozenset({"attn_softcap", "qkv_bias"})) == {"attn_softcap"}
    with pytest.raises(ModelError, match=r"^gemma2: DecodeStep does not compute attn_softcap$"):
        require("DecodeStep", frozenset({"attn_softcap"}), "gemma2")
    require("Transformer.forward", frozenset(FEATURES), "any")


@pytest.mark.skipif(not kernels.available(), reason="the one-call step needs the compiled kernels")
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3_text", "gemma2", "phi3", "phi4_mini",
                                    "smollm3", "olmo2", "granite"])
def test_the_one_call_step_is_taken_only_where_it_computes_every_feature(tmp_path, sp_model_bytes, family):
    """Gemma 2 (soft-capped scores), SmolLM3 (layers without RoPE), OLMo 2 (its norms) and Granite
    (its residual multiplier) decode layer by layer; the rest in one call. Their numbers on either
    path are tests/model/test_families.py's."""
    from inference.serving.engine import Engine
    from tiny_families import make_family_model

    d, _ = make_family_model(tmp_path, family, sp_model_bytes)
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as engine:
        lacking = missing("DecodeStep", engine.cfg.features())
        assert (engine.model.decode_step is None) == bool(lacking)
        assert bool(lacking) == (family in ("gemma2", "smollm3", "olmo2", "granite"))
        assert SPECS[engine.cfg.family].features() <= engine.cfg.features()
