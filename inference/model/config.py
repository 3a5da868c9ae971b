"""One dataclass describing a LLaMA-style model, read from a Hugging Face config.json.

The families (families.py) differ by a few turns on one path; each is a field here, so the model
code reads `cfg.qk_norm`, never the family's name."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from inference.errors import ModelError
from inference.model.families import RopeScaling, config_fields, hf_config



@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    max_seq_len: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    explicit_head_dim: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # ---- the turns a family takes (families.py reads them from its config)
    family: str = "llama"  # the Hugging Face model_type the config named
    qkv_bias: bool = False  # Qwen2: biases on the Q, K and V projections
    qk_norm: bool = False  # Qwen3, Gemma 3: an RMSNorm over each head's q and k, before RoPE
    qk_norm_full: bool = False  # OLMo 2: an RMSNorm over the whole q (q_dim) and k (kv_dim)
    pre_norms: bool = True  # an RMSNorm before attention and before the MLP (not OLMo 2)
    post_norms: bool = False  # Gemma, OLMo 2: norms after attention and after the MLP
    norm_unit_offset: bool = False  # Gemma: RMSNorm scales by (1 + w), folded into w at load
    activation: str = "silu"  # the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0  # Gemma: embeddings are multiplied by sqrt(hidden_size)
    query_pre_attn_scalar: float | None = None  # Gemma: scores scaled by its ** -0.5, not head_dim's
    attention_multiplier: float | None = None  # Granite: the scores' scale itself
    attn_logit_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap)
    logit_scale: float = 1.0  # Granite: logits divided by it
    residual_multiplier: float = 1.0  # Granite: each branch's output times it
    nope_layers: tuple[int, ...] = ()  # SmolLM3: layers that apply no RoPE
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included
    layer_types: tuple[str, ...] = ()  # per layer "full" or "sliding"; () means all full
    local_rope_theta: float | None = None  # Gemma 3: sliding layers' own RoPE base (unscaled)
    partial_rotary_dim: int | None = None  # Phi-4-mini: RoPE turns each head's first this many dims; None: all

    # Derived once, in __post_init__.
    head_dim: int = field(init=False)
    n_rep: int = field(init=False)  # query heads per KV head (GQA group size)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads",
                     "n_kv_heads", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelError(f"config: {name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ModelError(f"config: num_attention_heads ({self.n_heads}) is not a multiple "
                             f"of num_key_value_heads ({self.n_kv_heads})")
        head_dim = self.explicit_head_dim or self.hidden_size // self.n_heads
        if self.explicit_head_dim is None and self.hidden_size % self.n_heads:
            raise ModelError(f"config: hidden_size ({self.hidden_size}) is not divisible by "
                             f"num_attention_heads ({self.n_heads}) and no head_dim is given")
        if head_dim % 2:
            raise ModelError(f"config: head_dim must be even for RoPE, got {head_dim}")
        object.__setattr__(self, "head_dim", head_dim)
        object.__setattr__(self, "n_rep", self.n_heads // self.n_kv_heads)
        if self.activation not in ("silu", "gelu_tanh"):
            raise ModelError(f"config: activation {self.activation!r} is not supported")
        if self.layer_types and len(self.layer_types) != self.n_layers:
            raise ModelError(f"config: layer_types has {len(self.layer_types)} entries for "
                             f"{self.n_layers} layers")
        if any(t not in ("full", "sliding") for t in self.layer_types):
            raise ModelError(f"config: layer types must be full or sliding, got {self.layer_types}")
        if "sliding" in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
            raise ModelError("config: sliding layers need a positive sliding_window")
        if any(not 0 <= i < self.n_layers for i in self.nope_layers):
            raise ModelError(f"config: layers without RoPE {self.nope_layers} out of range")
        if self.qk_norm and self.qk_norm_full:
            raise ModelError("config: q/k norms are per head or over the whole vector, not both")
        if self.local_rope_theta is not None and self.nope_layers:
            raise ModelError("config: layers without RoPE beside sliding layers' own base are not supported")
        if self.partial_rotary_dim == head_dim:  # every dim: not partial
            object.__setattr__(self, "partial_rotary_dim", None)
        r = self.rotary_dim
        if r <= 0 or r > head_dim or r % 2:
            raise ModelError(f"config: RoPE must turn an even number of a head's {head_dim} dims, got {r}")
        rs = self.rope_scaling
        if rs.rope_type == "longrope" and not len(rs.short_factor) == len(rs.long_factor) == r // 2:
            raise ModelError(f"config: LongRoPE needs {r // 2} short and long factors (one per frequency), "
                             f"got {len(rs.short_factor)} and {len(rs.long_factor)}")

    def features(self) -> frozenset[str]:
        """The features (family_spec.FEATURES) this model's path needs: what a forward path must
        compute to give its numbers."""
        checks = {
            "qkv_bias": self.qkv_bias, "qk_norm": self.qk_norm, "qk_norm_full": self.qk_norm_full,
            "no_pre_norms": not self.pre_norms, "post_norms": self.post_norms,
            "norm_unit_offset": self.norm_unit_offset, "gelu": self.activation != "silu",
            "embed_scale": self.embed_scale != 1.0,
            "attn_scale": self.query_pre_attn_scalar is not None or self.attention_multiplier is not None,
            "attn_softcap": self.attn_logit_softcap is not None,
            "final_softcap": self.final_logit_softcap is not None, "logit_scale": self.logit_scale != 1.0,
            "residual_scale": self.residual_multiplier != 1.0, "sliding_window": "sliding" in self.layer_types,
            "local_rope_theta": self.local_rope_theta is not None, "nope_layers": bool(self.nope_layers),
            "rope_scaled": self.rope_scaling.rope_type != "default",
            "partial_rotary": self.partial_rotary_dim is not None,
        }
        return frozenset(k for k, on in checks.items() if on)

    def rope_kind(self, layer: int) -> str:
        """Which RoPE table `layer` reads: "full", "local" (sliding layers' own base) or "none"."""
        if layer in self.nope_layers:
            return "none"
        return "local" if self.local_rope_theta is not None and self.is_sliding(layer) else "full"

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer`'s queries see only the last sliding_window positions."""
        return bool(self.layer_types) and self.layer_types[layer] == "sliding"

    @property
    def rotary_dim(self) -> int:
        """The dims of each head RoPE turns (the first ones; the rest pass through unturned)."""
        return self.partial_rotary_dim or self.head_dim

    @property
    def attn_scale(self) -> float:
        """The factor on q.k: 1/sqrt(head_dim), Gemma's 1/sqrt(query_pre_attn_scalar), or Granite's
        attention_multiplier."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> "ModelConfig":
        """The config of a family families.py knows; any other is refused."""
        return cls(**config_fields(cfg))

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot read {path}: {e}") from None
        if not isinstance(data, dict):
            raise ModelError(f"{path}: expected a JSON object")
        return cls.from_hf_dict(data)

    def to_hf_dict(self) -> dict:
        """A config.json transformers reads as this family (families.py)."""
        return hf_config(self)

    # ---- sizes used by the UI, the FLOP counter and the KV cache ----

    def kv_bytes_per_token(self, bytes_per_value: int) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per value."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_value

    def param_counts(self) -> dict[str, int]:
        h, L = self.hidden_size, self.n_layers
        embed = self.vocab_size * h
        attn = L * (h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h)
        attn += L * (self.q_dim + 2 * self.kv_dim) * self.qkv_bias
        ffn = L * 3 * h * self.intermediate_size
        norms = L * (2 * self.pre_norms + 2 * self.post_norms) * h + h + L * 2 * self.head_dim * self.qk_norm
        norms += L * (self.q_dim + self.kv_dim) * self.qk_norm_full
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return {"embedding": embed, "attention": attn, "ffn": ffn, "norms": norms,
                "lm_head": head, "total": embed + attn + ffn + norms + head}

