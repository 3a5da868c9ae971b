"""Tiny checkpoints of each family, made by transformers' own model classes with random weights
(every norm, bias and scale perturbed, so each family's turns change the numbers)."""

from __future__ import annotations

from pathlib import Path

import torch

from tiny_models import write_tokenizer

COMMON = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

# family -> (transformers config class name, model class name, config overrides)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, rope_theta=1_000_000.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        final_logit_softcapping=5.0)),
    # Soft-capped scores (a cap of 2 bites on these scores), even layers sliding.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=32, query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=2.0,
        final_logit_softcapping=5.0)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=8)),  # fused q/k/v and gate/up
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layer_interval=2)),  # layer 1: no RoPE
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),  # norms after each branch, over whole q and k
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.5)),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}, rope_theta=10_000.0)),
    "qwen2_yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, rope_theta=10_000.0)),
    # Phi-3.5-mini's LongRoPE: its short factors up to the original 64 positions (of 256), cos and
    # sin times sqrt(1 + ln 4 / ln 64); the long ones differ, so using them would show.
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", dict(
        sliding_window=8, original_max_position_embeddings=64, rope_scaling={
            "rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.6, 3.3, 4.1],
            "long_factor": [1.0, 1.5, 2.5, 4.0, 6.5, 10.0, 16.0, 24.0]})),
    # Phi-4-mini's shape: RoPE on the first 12 of 16 dims of each head (0.75), and LongRoPE.
    "phi4_mini": ("Phi3Config", "Phi3ForCausalLM", dict(
        partial_rotary_factor=0.75, original_max_position_embeddings=64, tie_word_embeddings=True, rope_scaling={
            "rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 1.9, 2.4, 3.0],
            "long_factor": [1.0, 2.0, 3.5, 6.0, 10.0, 17.0]})),
}


def randomize(model: torch.nn.Module, seed: int, norms_around: float) -> None:
    """Every parameter random: matrices ~ N(0, 0.08), embeddings wider, norms and biases moved
    off their initial values (norms_around: 1 for w * x norms, 0 for Gemma's (1 + w) * x)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(norms_around + 0.15 * noise)
            elif p.dim() == 1:  # a bias
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise * (0.3 if "embed" in name else 0.08))


def make_family_model(root: Path, family: str, sp_model: bytes, seed: int = 0, **changes):
    """Write family's tiny checkpoint under root/family; return (directory, the HF model).
    changes: config fields over the family's tiny ones."""
    import transformers

    config_cls, model_cls, overrides = FAMILIES[family]
    cfg = getattr(transformers, config_cls)(**{**COMMON, **overrides, **changes})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    randomize(model, seed, 0.0 if family.startswith("gemma") else 1.0)
    d = Path(root) / family
    model.save_pretrained(d)
    write_tokenizer(d, sp_model)
    return d, model


def make_gemma3_multimodal(root: Path, sp_model: bytes, seed: int = 0):
    """A gemma3 checkpoint (Gemma3ForConditionalGeneration: a tiny vision tower beside the text
    model); return (directory, the HF model)."""
    import transformers

    overrides = {**FAMILIES["gemma3_text"][2], "final_logit_softcapping": None}  # see families.py
    text = transformers.Gemma3TextConfig(**COMMON, **overrides)
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                    mm_tokens_per_image=4, image_token_index=383, boi_token_index=381,
                                    eoi_token_index=382)
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    randomize(model, seed, 0.0)
    d = Path(root) / "gemma3"
    model.save_pretrained(d)
    write_tokenizer(d, sp_model)
    return d, model
