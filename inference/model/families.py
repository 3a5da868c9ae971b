"""Reading a Hugging Face config.json into ModelConfig's fields, as its family (family_spec.py) says,
and writing one back that transformers reads as the same family.

Anything a family's config sets that the path cannot compute exactly is refused here, in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference.errors import ModelError
from inference.model.family_spec import SPECS, spec_for_hf

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "factors")
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}


@dataclass(frozen=True)
class RopeScaling:
    """A config's RoPE scaling (rope_scaling, or rope_parameters in transformers >= 5); "factors":
    a GGUF file's per-frequency divisors (llama.cpp's rope_freqs.weight); "longrope": Phi-3.5's
    and Phi-4-mini's, of which the short factors are computed (docs/design.md: LongRoPE)."""
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0  # YaRN's ramp
    beta_slow: float = 1.0
    # YaRN, LongRoPE: cos and sin times this (None: YaRN's 0.1 ln(factor) + 1, LongRoPE's
    # sqrt(1 + ln(factor) / ln(original_max_position_embeddings)))
    attention_factor: float | None = None
    factors: tuple[float, ...] = ()  # "factors": one per frequency
    short_factor: tuple[float, ...] = ()  # "longrope": per frequency, up to the original context
    long_factor: tuple[float, ...] = ()  # "longrope": beyond it (read, kept, not computed)


def config_fields(cfg: dict) -> dict:
    """ModelConfig's keyword arguments for a Hugging Face config dict."""
    arch = cfg.get("model_type", "llama")
    if arch == "gemma3":  # a multimodal checkpoint: Token Lab runs its language model
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise ModelError("config: a gemma3 config needs its text_config")
        if text.get("final_logit_softcapping"):  # Gemma3ForConditionalGeneration never applies it
            raise ModelError("config: a gemma3 checkpoint with final_logit_softcapping is ambiguous "
                             "(transformers' multimodal class ignores it); refusing it")
        cfg = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": cfg.get("eos_token_id"),
               "tie_word_embeddings": cfg.get("tie_word_embeddings", True), **text}
    spec = spec_for_hf(arch)
    gemma = spec.norm_unit_offset
    if cfg.get("mlp_bias") or (cfg.get("attention_bias") and not spec.qkv_bias):
        raise ModelError("config: attention_bias / mlp_bias are not supported")
    if cfg.get("attn_logit_softcapping") and spec.name != "gemma2" or cfg.get("use_bidirectional_attention"):
        raise ModelError("config: attention soft-capping and bidirectional attention are not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or spec.activation
    if act not in ("silu", "gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelError(f"config: hidden_act {act!r} is not supported (silu or gelu_pytorch_tanh)")
    try:
        eos = cfg.get("eos_token_id")
        partial = _partial_rotary_factor(cfg)
        if partial != 1.0 and "partial_rotary" not in spec.may:
            raise ModelError(f"config: partial rotary embeddings (partial_rotary_factor) are not supported for {spec.name}")
        n_heads = int(cfg["num_attention_heads"])
        n_layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        window, layer_types = _sliding(cfg, spec.name, n_layers)
        theta, scaling, local_theta = _rope(cfg, spec.name)
        max_len = int(cfg.get("max_position_embeddings", 2048))
        if scaling.rope_type == "longrope":  # its short factors only: see _longrope
            max_len = min(max_len, scaling.original_max_position_embeddings)
        head_dim = int(cfg["head_dim"]) if cfg.get("head_dim") else (256 if gemma else hidden // n_heads)
        cap, attn_cap = cfg.get("final_logit_softcapping"), cfg.get("attn_logit_softcapping")
        granite = spec.name == "granite"
        return dict(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            max_seq_len=max_len,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6 if gemma else 1e-5)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
            explicit_head_dim=int(cfg["head_dim"]) if cfg.get("head_dim") else (256 if gemma else None),
            partial_rotary_dim=int(head_dim * partial) if partial != 1.0 else None,  # transformers' int()
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)),
            family=spec.name,
            qkv_bias=spec.qkv_bias,
            qk_norm=spec.qk_norm == "head",
            qk_norm_full=spec.qk_norm == "full",
            pre_norms="attention_norm" in spec.norms,
            post_norms="post_attention_norm" in spec.norms,
            norm_unit_offset=spec.norm_unit_offset,
            activation="silu" if act == "silu" else "gelu_tanh",
            embed_scale=hidden ** 0.5 if gemma else float(cfg.get("embedding_multiplier", 1.0)) if granite else 1.0,
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)) if gemma else None,
            attention_multiplier=float(cfg.get("attention_multiplier", 1.0)) if granite else None,
            attn_logit_softcap=float(attn_cap) if attn_cap and spec.name == "gemma2" else None,
            final_logit_softcap=float(cap) if cap else None,
            logit_scale=float(cfg.get("logits_scaling", 1.0)) if granite else 1.0,
            residual_multiplier=float(cfg.get("residual_multiplier", 1.0)) if granite else 1.0,
            sliding_window=window,
            layer_types=layer_types,
            local_rope_theta=local_theta,
            nope_layers=_nope(cfg, n_layers) if spec.name == "smollm3" else (),
        )
    except KeyError as e:
        raise ModelError(f"config: missing required field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ModelError(f"config: bad value ({e})") from None


def _nope(cfg: dict, n_layers: int) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: no_rope_layers[i] == 0 (1: the layer rotates), or every
    no_rope_layer_interval-th layer."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        every = int(cfg.get("no_rope_layer_interval", 4))
        flags = [int((i + 1) % every != 0) for i in range(n_layers)]
    if len(flags) != n_layers:
        raise ModelError(f"config: no_rope_layers has {len(flags)} entries for {n_layers} layers")
    return tuple(i for i, rotates in enumerate(flags) if not rotates)


def _sliding(cfg: dict, family: str, n_layers: int) -> tuple[int | None, tuple[str, ...]]:
    """(window, per-layer types) as transformers sets them for the family; () when all are full."""
    if family in ("llama", "olmo2", "granite"):
        return None, ()
    window = cfg.get("sliding_window", 4096 if family.startswith("gemma") else None)
    if family in ("qwen2", "qwen3", "smollm3") and not cfg.get("use_sliding_window", False):
        window = None
    if window is None:
        return None, ()
    if family in ("mistral", "phi3"):  # every layer slides (their layer_types, if any, are not read)
        types = ["sliding_attention"] * n_layers
    elif cfg.get("layer_types"):
        types = list(cfg["layer_types"])
    elif family == "gemma3_text":  # every sliding_window_pattern-th layer is global
        pattern = int(cfg.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    elif family == "gemma2":  # even layers slide
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    elif family == "smollm3":
        raise ModelError("config: a SmolLM3 sliding window without layer_types is not supported")
    else:  # Qwen: the layers from max_window_layers on
        first = int(cfg.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise ModelError(f"config: layer type {unknown[0]!r} is not supported")
    ours = tuple(LAYER_TYPES[t] for t in types)
    return (int(window), ours) if "sliding" in ours else (None, ())


def _partial_rotary_factor(cfg: dict) -> float:
    """The share of each head's dims RoPE turns: rope_parameters' (or Phi-3's rope_scaling's), else
    the config's own."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return float(rs.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) if isinstance(rs, dict)
                 else cfg.get("partial_rotary_factor", 1.0))


def _rope(cfg: dict, family: str):
    """(global theta, global scaling, sliding layers' theta or None)."""
    if family != "gemma3_text":
        return _rope_theta(cfg, 10000.0), _rope_scaling(cfg, family), None
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers >= 5: one set per layer type
        full, local = params["full_attention"] or {}, params.get("sliding_attention") or {}
    else:
        full = {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta", 1_000_000.0)}
        local = {"rope_theta": cfg.get("rope_local_base_freq", 10_000.0)}
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise ModelError("config: scaled RoPE on sliding layers is not supported")
    if full.get("rope_type", full.get("type")) == "longrope":
        raise ModelError("config: LongRoPE on gemma3 is not supported")
    return (float(full.get("rope_theta", 1_000_000.0)), _rope_scaling({"rope_scaling": full}),
            float(local.get("rope_theta", 10_000.0)))


def _rope_theta(cfg: dict, default: float) -> float:
    params = cfg.get("rope_parameters") or {}
    return params.get("rope_theta", cfg.get("rope_theta", default))


def _rope_scaling(cfg: dict, family: str = "") -> RopeScaling:
    # Older configs say rope_scaling; transformers >= 5 writes rope_parameters.
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rs, dict):
        raise ModelError(f"config: rope_scaling must be an object, got {rs!r}")
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if family == "phi3" and rope_type in ("su", "yarn"):  # Phi3Config's older names for LongRoPE
        rope_type = "longrope"
    if rope_type not in ROPE_TYPES:
        raise ModelError(f"config: rope type {rope_type!r} is not supported "
                         f"(supported: {', '.join(ROPE_TYPES)})")
    if rope_type == "default":
        return RopeScaling()
    if rope_type == "factors":
        return RopeScaling(rope_type="factors", factors=tuple(float(f) for f in rs["factors"]))
    if rope_type == "longrope":
        return _longrope(cfg, rs, family)
    factor = float(rs.get("factor", 1.0))
    if not math.isfinite(factor) or factor <= 0:
        raise ModelError(f"config: rope scaling factor must be positive, got {factor}")
    if rope_type == "yarn" and (rs.get("mscale") or rs.get("mscale_all_dim")):
        raise ModelError("config: YaRN with mscale / mscale_all_dim is not supported")
    if rope_type == "yarn" and rs.get("truncate") is False:
        raise ModelError("config: YaRN without truncation is not supported")
    attention_factor = rs.get("attention_factor")
    return RopeScaling(
        rope_type=rope_type,
        factor=factor,
        low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(rs.get("original_max_position_embeddings", 8192)),
        beta_fast=float(rs.get("beta_fast") or 32.0),
        beta_slow=float(rs.get("beta_slow") or 1.0),
        attention_factor=None if attention_factor is None else float(attention_factor),
    )


def _longrope(cfg: dict, rs: dict, family: str) -> RopeScaling:
    """LongRoPE as transformers computes it (_compute_longrope_parameters): each frequency divided
    by its short factor while the positions a forward pass holds stay within the original context,
    by its long factor beyond (longrope_frequency_update), cos and sin times the attention factor.
    Which set a position gets in transformers depends on how the text was cut into forward passes
    (a prompt past the bound: long for all of it; a run that grows past it: short keys, then long),
    so past the bound no one number is the model's: the context is capped at the original
    (config_fields), where every pass takes the short factors."""
    max_len = int(cfg.get("max_position_embeddings", 2048))
    if "original_max_position_embeddings" in cfg or family == "phi3":  # Phi3Config's, first (4096 if unset)
        original = int(cfg.get("original_max_position_embeddings") or 4096)
    else:
        original = int(rs.get("original_max_position_embeddings") or max_len)
    factor = rs.get("factor")
    factor = max_len / original if factor is None else float(factor)
    attention = rs.get("attention_factor")
    if not math.isfinite(factor) or factor <= 0 or original <= 0:
        raise ModelError(f"config: LongRoPE needs a positive factor and original context, got {factor}, {original}")
    return RopeScaling(rope_type="longrope", factor=factor, original_max_position_embeddings=original,
                       attention_factor=None if attention is None else float(attention),
                       short_factor=tuple(float(f) for f in rs["short_factor"]),
                       long_factor=tuple(float(f) for f in rs["long_factor"]))


# ---------------------------------------------------------------- writing a config.json

def _scaling_dict(rs: RopeScaling) -> dict | None:
    if rs.rope_type == "default":
        return None
    if rs.rope_type == "factors":
        return {"rope_type": "factors", "factors": list(rs.factors)}
    out = {"rope_type": rs.rope_type, "factor": rs.factor}
    if rs.rope_type == "longrope":
        out.update(short_factor=list(rs.short_factor), long_factor=list(rs.long_factor),
                   original_max_position_embeddings=rs.original_max_position_embeddings)
        if rs.attention_factor is not None:
            out["attention_factor"] = rs.attention_factor
    if rs.rope_type == "llama3":
        out.update(low_freq_factor=rs.low_freq_factor, high_freq_factor=rs.high_freq_factor,
                   original_max_position_embeddings=rs.original_max_position_embeddings)
    if rs.rope_type == "yarn":
        out.update(original_max_position_embeddings=rs.original_max_position_embeddings,
                   beta_fast=rs.beta_fast, beta_slow=rs.beta_slow)
        if rs.attention_factor is not None:
            out["attention_factor"] = rs.attention_factor
    return out


def hf_config(c) -> dict:
    """A config.json for ModelConfig c that reads back as c (and that transformers reads as c's
    family, but for a GGUF file's RoPE factors, which only Token Lab reads)."""
    spec = SPECS[c.family]
    scaling = _scaling_dict(c.rope_scaling)
    out = {
        "architectures": [spec.hf_class],
        "model_type": c.family,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu" if c.activation == "silu" else "gelu_pytorch_tanh",
        "bos_token_id": c.bos_token_id,
        "eos_token_id": list(c.eos_token_ids) if len(c.eos_token_ids) != 1 else c.eos_token_ids[0],
    }
    if scaling:
        out["rope_scaling"] = scaling
    if c.rope_scaling.rope_type == "longrope":  # Phi3Config reads it here first
        out["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings
    if c.partial_rotary_dim is not None:
        out["partial_rotary_factor"] = partial_rotary_factor(c.partial_rotary_dim, c.head_dim)
    types = [{"full": "full_attention", "sliding": "sliding_attention"}[t] for t in c.layer_types]
    if c.family in ("mistral", "phi3"):
        out["sliding_window"] = c.sliding_window
    elif c.family in ("qwen2", "qwen3"):
        out.update(use_sliding_window=bool(types), sliding_window=c.sliding_window,
                   max_window_layers=c.n_layers, layer_types=types or ["full_attention"] * c.n_layers)
    elif c.family == "smollm3":
        out.update(no_rope_layers=[int(i not in c.nope_layers) for i in range(c.n_layers)],
                   use_sliding_window=bool(types), sliding_window=c.sliding_window,
                   layer_types=types or ["full_attention"] * c.n_layers)
    elif c.family == "granite":
        out.update(embedding_multiplier=c.embed_scale, attention_multiplier=c.attention_multiplier,
                   residual_multiplier=c.residual_multiplier, logits_scaling=c.logit_scale)
    elif c.family == "gemma2":
        out.update(hidden_activation=out.pop("hidden_act"), query_pre_attn_scalar=_int_if_whole(c.query_pre_attn_scalar),
                   sliding_window=c.sliding_window or c.max_seq_len, layer_types=types or ["full_attention"] * c.n_layers,
                   final_logit_softcapping=c.final_logit_softcap, attn_logit_softcapping=c.attn_logit_softcap)
    elif c.family == "gemma3_text":
        del out["rope_theta"]
        out.pop("rope_scaling", None)
        full = {"rope_type": "default", **(scaling or {}), "rope_theta": c.rope_theta}
        out.update(
            hidden_activation=out.pop("hidden_act"), query_pre_attn_scalar=_int_if_whole(c.query_pre_attn_scalar),
            sliding_window=c.sliding_window or c.max_seq_len,
            layer_types=types or ["full_attention"] * c.n_layers,
            final_logit_softcapping=c.final_logit_softcap, attn_logit_softcapping=None,
            rope_parameters={"full_attention": full, "sliding_attention": {
                "rope_type": "default", "rope_theta": c.local_rope_theta or 10_000.0}})
    return out


def partial_rotary_factor(rotary_dim: int, head_dim: int) -> float:
    """The partial_rotary_factor from which transformers' int(head_dim * factor) is rotary_dim."""
    factor = rotary_dim / head_dim
    if int(head_dim * factor) != rotary_dim:
        raise ModelError(f"config: RoPE on {rotary_dim} of {head_dim} dims is no partial_rotary_factor")
    return factor


def _int_if_whole(x: float) -> int | float:
    """transformers' Gemma configs insist on an int where the value is whole."""
    return int(x) if float(x).is_integer() else x
