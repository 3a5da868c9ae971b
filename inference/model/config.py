"""One dataclass describing a LLaMA-architecture model, read from a Hugging Face config.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from inference.errors import ModelError

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> "ModelConfig":
        arch = cfg.get("model_type", "llama")
        if arch not in ("llama", "mistral", "smollm", "smollm2"):
            raise ModelError(f"config: model_type {arch!r} is not a LLaMA-architecture model")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ModelError("config: attention_bias / mlp_bias are not supported")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ModelError(f"config: hidden_act {act!r} is not supported (SwiGLU needs 'silu')")
        try:
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            n_heads = int(cfg["num_attention_heads"])
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=int(cfg["hidden_size"]),
                intermediate_size=int(cfg["intermediate_size"]),
                n_layers=int(cfg["num_hidden_layers"]),
                n_heads=n_heads,
                n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
                max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(_rope_theta(cfg)),
                rope_scaling=_rope_scaling(cfg),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                explicit_head_dim=int(cfg["head_dim"]) if cfg.get("head_dim") else None,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise ModelError(f"config: missing required field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelError(f"config: bad value ({e})") from None

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
        rs = self.rope_scaling
        out = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_seq_len,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
        }
        if rs.rope_type != "default":
            out["rope_scaling"] = {"rope_type": rs.rope_type, "factor": rs.factor}
            if rs.rope_type == "llama3":
                out["rope_scaling"].update(
                    low_freq_factor=rs.low_freq_factor, high_freq_factor=rs.high_freq_factor,
                    original_max_position_embeddings=rs.original_max_position_embeddings)
        return out

    # ---- sizes used by the UI, the FLOP counter and the KV cache ----

    def kv_bytes_per_token(self, bytes_per_value: int) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per value."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_value

    def param_counts(self) -> dict[str, int]:
        h, L = self.hidden_size, self.n_layers
        embed = self.vocab_size * h
        attn = L * (h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h)
        ffn = L * 3 * h * self.intermediate_size
        norms = L * 2 * h + h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return {"embedding": embed, "attention": attn, "ffn": ffn, "norms": norms,
                "lm_head": head, "total": embed + attn + ffn + norms + head}


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or {}
    return params.get("rope_theta", cfg.get("rope_theta", 10000.0))


def _rope_scaling(cfg: dict) -> RopeScaling:
    # Older configs say rope_scaling; transformers >= 5 writes rope_parameters.
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rs, dict):
        raise ModelError(f"config: rope_scaling must be an object, got {rs!r}")
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ModelError(f"config: rope type {rope_type!r} is not supported "
                         f"(supported: {', '.join(ROPE_TYPES)})")
    if rope_type == "default":
        return RopeScaling()
    factor = float(rs.get("factor", 1.0))
    if not math.isfinite(factor) or factor <= 0:
        raise ModelError(f"config: rope scaling factor must be positive, got {factor}")
    return RopeScaling(
        rope_type=rope_type,
        factor=factor,
        low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(rs.get("original_max_position_embeddings", 8192)),
    )
