"""A family is one spec: the turns it takes on the one LLaMA-style path, its tensors' names in a
Hugging Face checkpoint and in a GGUF file, and what a token meets on the way (the card's words).

Every forward path declares the features it computes (PATHS); a model whose config needs a
feature a path lacks takes another path or is refused (`require`), never computed as if the
feature were absent. ModelConfig.features() derives a config's features from its fields; a new
field that changes a token's path must be named in FEATURES (tests/model/test_family_spec.py
fails otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.errors import ModelError

# feature -> what it does to a token, in the card's and the lesson's words
FEATURES = {
    "qkv_bias": "biases on the Q, K and V projections",
    "qk_norm": "an RMSNorm over each head's q and k, before RoPE",
    "qk_norm_full": "an RMSNorm over the whole q and the whole k vector, before RoPE",
    "no_pre_norms": "no norm before attention or the MLP: each branch's output is normed instead",
    "post_norms": "an RMSNorm after attention and after the MLP, before each residual add",
    "norm_unit_offset": "RMSNorm scales by (1 + w)",
    "gelu": "GeGLU: gelu_tanh(gate) × up",
    "embed_scale": "the embedding is multiplied by a constant",
    "attn_scale": "scores scaled by a constant of the family's, not 1/√head_dim",
    "attn_softcap": "attention scores soft-capped: cap · tanh(scores / cap)",
    "final_softcap": "logits soft-capped: cap · tanh(logits / cap)",
    "logit_scale": "logits divided by a constant",
    "residual_scale": "each branch's output multiplied by a constant before the residual add",
    "sliding_window": "some layers see only the last W positions",
    "local_rope_theta": "sliding layers rotate at a RoPE base of their own",
    "nope_layers": "some layers apply no RoPE at all",
    "rope_scaled": "RoPE frequencies rescaled (linear, llama3, YaRN, LongRoPE's short factors, or a file's factors)",
    "partial_rotary": "RoPE turns only each head's first dims; the rest pass through unturned",
}

# ---------------------------------------------------------------- tensor names by role
# A layer's tensors by our role, with their Hugging Face suffix (after model.layers.N.) and their
# llama.cpp name (after blk.N.). Norm roles a family has are listed in its spec.
HF_NORMS = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
GEMMA_HF_NORMS = {"attention_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                  "ffn_norm": "pre_feedforward_layernorm", "post_ffn_norm": "post_feedforward_layernorm"}
OLMO2_HF_NORMS = {"post_attention_norm": "post_attention_layernorm", "post_ffn_norm": "post_feedforward_layernorm"}
GGUF_ROLES = {  # our role -> llama.cpp's tensor name in a block
    "attention_norm": "attn_norm", "ffn_norm": "ffn_norm", "post_attention_norm": "post_attention_norm",
    "post_ffn_norm": "post_ffw_norm", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "qkv_proj": "attn_qkv", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "gate_up_proj": "ffn_up", "down_proj": "ffn_down",
}
HF_MATRICES = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
               "qkv_proj": "self_attn.qkv_proj", "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj",
               "up_proj": "mlp.up_proj", "gate_up_proj": "mlp.gate_up_proj", "down_proj": "mlp.down_proj",
               "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}


@dataclass(frozen=True)
class FamilySpec:
    """One family. Fixed turns are fields here; turns a config sets (a window, a scaling, a
    multiplier) are read by families.py into ModelConfig, named in `may`."""
    name: str  # ModelConfig.family
    hf_types: tuple[str, ...]  # config.json model_type values read as this family
    hf_class: str  # transformers' causal LM class
    gguf_arch: str | None  # llama.cpp's general.architecture
    norms: dict = field(default_factory=lambda: dict(HF_NORMS))  # our norm role -> HF suffix
    qkv_bias: bool = False
    qk_norm: str | None = None  # "head" (per head) or "full" (over q_dim / kv_dim)
    norm_unit_offset: bool = False  # (1 + w): folded into w at load
    activation: str = "silu"
    fused: bool = False  # HF stores qkv_proj and gate_up_proj (llama.cpp: attn_qkv, ffn_up)
    gguf_permutes_qk: bool = False  # llama.cpp's converter interleaves Q/K rows (its LlamaModel's)
    may: frozenset = frozenset()  # config-set features this family can turn on
    example: str = ""  # a model people run

    def features(self) -> frozenset:
        """The features every model of the family has."""
        out = set()
        if self.qkv_bias:
            out.add("qkv_bias")
        if self.qk_norm:
            out.add("qk_norm" if self.qk_norm == "head" else "qk_norm_full")
        if "attention_norm" not in self.norms:
            out.add("no_pre_norms")
        if "post_attention_norm" in self.norms:
            out.add("post_norms")
        if self.norm_unit_offset:
            out.add("norm_unit_offset")
        if self.activation != "silu":
            out.add("gelu")
        return frozenset(out)

    def matrices(self) -> tuple[str, ...]:
        """The layer's matrix roles, as the Hugging Face checkpoint stores them."""
        if self.fused:
            return ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        return ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


_ROPE = frozenset({"rope_scaled"})
SPECS = {s.name: s for s in (
    FamilySpec("llama", ("llama", "smollm", "smollm2"), "LlamaForCausalLM", "llama", gguf_permutes_qk=True,
               may=_ROPE, example="Llama 3.x, SmolLM2"),
    FamilySpec("mistral", ("mistral",), "MistralForCausalLM", None, may=_ROPE | {"sliding_window"},
               example="Mistral 7B v0.1"),
    FamilySpec("qwen2", ("qwen2",), "Qwen2ForCausalLM", "qwen2", qkv_bias=True, may=_ROPE | {"sliding_window"},
               example="Qwen2.5, DeepSeek-R1-Distill-Qwen"),
    FamilySpec("qwen3", ("qwen3",), "Qwen3ForCausalLM", "qwen3", qk_norm="head", may=_ROPE | {"sliding_window"},
               example="Qwen3"),
    FamilySpec("gemma3_text", ("gemma3_text", "gemma3"), "Gemma3ForCausalLM", "gemma3", norms=dict(GEMMA_HF_NORMS),
               qk_norm="head", norm_unit_offset=True, activation="gelu_tanh",
               may=_ROPE | {"embed_scale", "attn_scale", "final_softcap", "sliding_window", "local_rope_theta"},
               example="Gemma 3"),
    FamilySpec("gemma2", ("gemma2",), "Gemma2ForCausalLM", "gemma2", norms=dict(GEMMA_HF_NORMS),
               norm_unit_offset=True, activation="gelu_tanh",
               may=_ROPE | {"embed_scale", "attn_scale", "attn_softcap", "final_softcap", "sliding_window"},
               example="Gemma 2"),
    FamilySpec("phi3", ("phi3",), "Phi3ForCausalLM", "phi3", fused=True,
               may=_ROPE | {"sliding_window", "partial_rotary"}, example="Phi-3-mini, Phi-3.5-mini, Phi-4-mini"),
    FamilySpec("smollm3", ("smollm3",), "SmolLM3ForCausalLM", "smollm3", gguf_permutes_qk=True, may=_ROPE | {"nope_layers", "sliding_window"},
               example="SmolLM3"),
    FamilySpec("olmo2", ("olmo2",), "Olmo2ForCausalLM", "olmo2", norms=dict(OLMO2_HF_NORMS), qk_norm="full",
               may=_ROPE, example="OLMo 2"),
    FamilySpec("granite", ("granite",), "GraniteForCausalLM", "granite", gguf_permutes_qk=True,
               may=_ROPE | {"embed_scale", "attn_scale", "residual_scale", "logit_scale"}, example="Granite 3.x"),
)}
BY_HF_TYPE = {t: s for s in SPECS.values() for t in s.hf_types}
BY_GGUF_ARCH = {s.gguf_arch: s for s in SPECS.values() if s.gguf_arch}


def spec_for_hf(model_type: str) -> FamilySpec:
    spec = BY_HF_TYPE.get(model_type)
    if spec is None:
        raise ModelError(f"config: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(sorted(BY_HF_TYPE))})")
    return spec


def spec_for_gguf(arch: str, file_name: str) -> FamilySpec:
    spec = BY_GGUF_ARCH.get(arch)
    if spec is None:
        raise ModelError(f"{file_name}: architecture {arch!r} is not supported "
                         f"(supported: {', '.join(sorted(BY_GGUF_ARCH))})")
    return spec


# ---------------------------------------------------------------- forward paths
# Each path names every feature: those it computes, and those it lacks (a model needing one of
# those never takes it). A feature added to FEATURES and not named by every path fails
# tests/model/test_family_spec.py.
TORCH = frozenset({"qkv_bias", "qk_norm", "qk_norm_full", "no_pre_norms", "post_norms", "norm_unit_offset", "gelu",
                   "embed_scale", "attn_scale", "attn_softcap", "final_softcap", "logit_scale", "residual_scale",
                   "sliding_window", "local_rope_theta", "nope_layers", "rope_scaled", "partial_rotary"})
# kernels.c's one-call step: the embedding, the logits' scale and cap stay in Python around it;
# RoPE comes in as two tables a row (full and sliding layers), as wide as the dims it turns;
# norms before each branch.
ONE_CALL = frozenset({"qkv_bias", "qk_norm", "post_norms", "norm_unit_offset", "gelu", "embed_scale", "attn_scale",
                      "final_softcap", "logit_scale", "sliding_window", "local_rope_theta", "rope_scaled",
                      "partial_rotary"})
PATHS = {  # path -> (computes, lacks)
    "Transformer.forward": (TORCH, frozenset()),  # torch, static cache
    "Transformer.forward_paged": (TORCH, frozenset()),  # torch layer by layer over the paged pool
    "StaticDecode": (TORCH, frozenset()),  # fixed buffers (CUDA graphs), through forward_paged's layers
    "DecodeStep": (ONE_CALL, frozenset({"attn_softcap", "nope_layers", "qk_norm_full", "no_pre_norms", "residual_scale"})),
}


def missing(path: str, features: frozenset) -> frozenset:
    """The features a model needs that `path` does not compute."""
    return frozenset(features) - PATHS[path][0]


def require(path: str, features: frozenset, family: str) -> None:
    """Refuse, in one line, a model that needs a feature `path` does not compute."""
    lacking = missing(path, features)
    if lacking:
        raise ModelError(f"{family}: {path} does not compute {', '.join(sorted(lacking))}")
