"""A GGUF file's metadata as a Hugging Face config of its family (family_spec.py): what llama.cpp
reads from the file, and what it assumes of each architecture where the file says nothing."""

from __future__ import annotations

import numpy as np

from inference.errors import ModelError
from inference.loading.gguf_reader import Meta
from inference.model.config import ModelConfig
from inference.model.families import partial_rotary_factor
from inference.model.family_spec import spec_for_gguf

# Tensors a file may hold beside the model's own, read into the config, not weights.
ROPE_FREQS = "rope_freqs.weight"
LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")


def _vector(meta: Meta, tensors: dict, name: str) -> list[float]:
    t = tensors[name]
    if t.qtype.name != "F32" or len(t.dims) != 1:
        raise ModelError(f"{meta.file_name}: {name} must be a float32 vector")
    return np.frombuffer(t.data, dtype=np.float32).tolist()


def _longrope(meta: Meta, arch: str, tensors: dict) -> dict:
    """Phi-3.5's and Phi-4-mini's LongRoPE as llama.cpp's converter stores it: both factor sets as
    tensors, the original context and the attention factor (sqrt(1 + ln(factor) / ln(original)))
    in the metadata."""
    if not all(t in tensors for t in LONGROPE):
        raise ModelError(f"{meta.file_name}: LongRoPE needs both {LONGROPE[0]} and {LONGROPE[1]}")
    original = meta.require(f"{arch}.rope.scaling.original_context_length", int)
    return {"rope_type": "longrope", "short_factor": _vector(meta, tensors, LONGROPE[1]),
            "long_factor": _vector(meta, tensors, LONGROPE[0]), "original_max_position_embeddings": original,
            "factor": meta.get(f"{arch}.context_length", original, int) / original,
            "attention_factor": meta.get(f"{arch}.rope.scaling.attn_factor", None, float)}


def _rope(meta: Meta, arch: str, tensors: dict) -> dict | None:
    """The rope_scaling a file stores: llama.cpp's rope_freqs.weight factors (Llama 3.1's llama3
    scaling, as the converter computed them), LongRoPE's factors, YaRN or linear in the metadata."""
    name = meta.file_name
    kind = meta.get(f"{arch}.rope.scaling.type", None, str)
    if any(t in tensors for t in LONGROPE):
        if kind not in (None, "none") or ROPE_FREQS in tensors:
            raise ModelError(f"{name}: LongRoPE factors beside another rope scaling are ambiguous")
        return _longrope(meta, arch, tensors)
    if ROPE_FREQS in tensors:
        if kind not in (None, "none"):
            raise ModelError(f"{name}: rope_freqs.weight beside rope scaling {kind!r} is ambiguous")
        return {"rope_type": "factors", "factors": _vector(meta, tensors, ROPE_FREQS)}
    if kind in (None, "none"):
        return None
    factor = float(meta.require(f"{arch}.rope.scaling.factor", float))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        attn = meta.get(f"{arch}.rope.scaling.attn_factor", None, float)
        if attn not in (None, 1.0) or meta.get(f"{arch}.rope.scaling.yarn_log_multiplier", None, float):
            raise ModelError(f"{name}: YaRN with an attention factor of the file's own is not supported")
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": meta.require(f"{arch}.rope.scaling.original_context_length", int),
                "beta_fast": meta.get(f"{arch}.rope.scaling.yarn_beta_fast", None, float),
                "beta_slow": meta.get(f"{arch}.rope.scaling.yarn_beta_slow", None, float)}
    raise ModelError(f"{name}: rope scaling {kind!r} is not supported (linear, yarn, or llama3's rope_freqs)")


def stop_ids(meta: Meta) -> list[int]:
    """The tokens that end a turn or the text: eos, end-of-turn and end-of-message, as stored."""
    out = []
    for key in ("eos", "eot", "eom"):
        tid = meta.get(f"tokenizer.ggml.{key}_token_id", None, int)
        if tid is not None and tid not in out:
            out.append(tid)
    return out


def config_from_gguf(meta: Meta, tensors: dict, vocab_size: int) -> ModelConfig:
    """The config of the file's model; an architecture, scaling or layout we cannot compute is
    refused in one line."""
    arch = meta.require("general.architecture", str)
    spec = spec_for_gguf(arch, meta.file_name)
    n_heads = meta.require(f"{arch}.attention.head_count", int)
    hidden = meta.require(f"{arch}.embedding_length", int)
    n_layers = meta.require(f"{arch}.block_count", int)
    # llama.cpp: a head is key_length dims (else hidden / heads), of which RoPE turns the first
    # dimension_count (else all)
    head_dim = meta.get(f"{arch}.attention.key_length", None, int)
    rope_dims = meta.get(f"{arch}.rope.dimension_count", None, int)
    if rope_dims is not None and rope_dims > (head_dim or hidden // n_heads):
        raise ModelError(f"{meta.file_name}: RoPE on {rope_dims} dims of heads of {head_dim or hidden // n_heads}")
    eos = stop_ids(meta)
    cfg = {
        "model_type": spec.hf_types[0],
        "vocab_size": meta.get(f"{arch}.vocab_size", vocab_size, int),
        "hidden_size": hidden,
        "intermediate_size": meta.require(f"{arch}.feed_forward_length", int),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", n_heads, int),
        "head_dim": head_dim if head_dim and head_dim != hidden // n_heads else None,
        "max_position_embeddings": meta.get(f"{arch}.context_length", 2048, int),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5, float)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0, float)),
        "rope_scaling": _rope(meta, arch, tensors),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", None, int),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
    }
    if rope_dims is not None and rope_dims != (head_dim or hidden // n_heads):  # Phi-4-mini: partial rotary
        cfg["partial_rotary_factor"] = partial_rotary_factor(rope_dims, head_dim or hidden // n_heads)
    window = meta.get(f"{arch}.attention.sliding_window", None, int)
    if arch in ("gemma2", "gemma3"):  # what llama.cpp assumes of every Gemma file
        d = head_dim or hidden // n_heads
        big = n_layers == (46 if arch == "gemma2" else 62)  # the 27B: 1/sqrt(hidden / heads)
        cfg.update(head_dim=d, query_pre_attn_scalar=hidden // n_heads if big else d,
                   final_logit_softcapping=meta.get(f"{arch}.final_logit_softcapping", None, float))
    if arch == "gemma3":
        cfg.update(model_type="gemma3_text", sliding_window=meta.require("gemma3.attention.sliding_window", int),
                   sliding_window_pattern=6, rope_local_base_freq=10000.0)
    elif arch == "gemma2":  # even layers slide (llama.cpp's pattern of 2)
        cfg.update(sliding_window=window or 4096, attn_logit_softcapping=meta.get(
            "gemma2.attn_logit_softcapping", None, float))
    elif arch == "granite":
        cfg.update(embedding_multiplier=meta.get("granite.embedding_scale", 1.0, float),
                   attention_multiplier=meta.get("granite.attention.scale", None, float) or (head_dim or hidden // n_heads) ** -0.5,
                   residual_multiplier=meta.get("granite.residual_scale", 1.0, float),
                   logits_scaling=meta.get("granite.logit_scale", 1.0, float))
    elif arch == "smollm3":  # llama.cpp: every 4th layer has no RoPE
        cfg["no_rope_layer_interval"] = 4
    elif arch == "olmo2" and window:
        raise ModelError(f"{meta.file_name}: an olmo2 file with a sliding window (OLMo 3) is not supported")
    # phi3: llama.cpp (and transformers' GGUF loading) compute no sliding window for Phi-3 files,
    # whatever the file says: neither do we.
    return ModelConfig.from_hf_dict(cfg)
