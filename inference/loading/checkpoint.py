"""Loading Hugging Face checkpoints of the families we run from safetensors, every tensor checked first."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from inference.model.config import ModelConfig
from inference.errors import ModelError
from inference.model.quant import QuantWeight

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def expected_hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of cfg's family must hold, with its shape."""
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.q_dim, h),
            p + "self_attn.k_proj.weight": (cfg.kv_dim, h),
            p + "self_attn.v_proj.weight": (cfg.kv_dim, h),
            p + "self_attn.o_proj.weight": (h, cfg.q_dim),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })
        if cfg.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (cfg.q_dim,), p + "self_attn.k_proj.bias": (cfg.kv_dim,),
                           p + "self_attn.v_proj.bias": (cfg.kv_dim,)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        if cfg.sandwich_norms:
            shapes.update({p + "pre_feedforward_layernorm.weight": (h,),
                           p + "post_feedforward_layernorm.weight": (h,)})
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


# A gemma3 (multimodal) checkpoint: its language model's tensors under these prefixes, as
# transformers >= 5 and earlier versions write them, and the vision tower's, which are skipped.
TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                 ("language_model.lm_head.", "lm_head."))
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                   "model.multi_modal_projector.")


def text_model_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name as the text model's, or None for a vision tensor."""
    if name.startswith(VISION_PREFIXES):
        return None
    for prefix, ours in TEXT_PREFIXES:
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return name


# Tensors some exporters write that carry nothing the model needs.
IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of a directory: one model.safetensors, or the shards of an index."""
    single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"{index}: not a valid safetensors index ({e})") from None
        files = []
        for name in names:
            shard = (model_dir / name).resolve()
            if shard.parent != model_dir.resolve():
                raise ModelError(f"{index}: shard {name!r} lies outside the model directory")
            if not shard.exists():
                raise ModelError(f"{index}: shard {name} is missing")
            files.append(shard)
        return files
    if single.exists():
        return [single]
    others = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if others:
        return [model_dir / n for n in others]
    pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelError(f"{model_dir} holds only pickle checkpoints ({', '.join(pickles)}); "
                         "Token Lab loads safetensors only, never pickle: convert the weights "
                         "to model.safetensors first")
    raise ModelError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


def read_hf_weights(model_dir: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Read and check every tensor; return them under Hugging Face names, as stored."""
    expected = expected_hf_shapes(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for path in safetensors_files(model_dir):
        try:
            with safe_open(str(path), framework="pt") as f:
                for stored in f.keys():
                    name = text_model_name(stored)
                    if name is None or name.endswith(IGNORABLE_SUFFIXES):
                        continue
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue  # tied: the head is the embedding matrix by definition
                    if name not in expected:
                        raise ModelError(f"{path.name}: unexpected tensor {name!r} "
                                         f"for a {cfg.family} model with this config")
                    shape = tuple(f.get_slice(stored).get_shape())
                    if shape != expected[name]:
                        raise ModelError(f"{path.name}: tensor {name} has shape {list(shape)}, "
                                         f"config.json implies {list(expected[name])}")
                    tensors[name] = f.get_tensor(stored)
        except SafetensorError as e:
            raise ModelError(f"{path.name}: corrupt or truncated safetensors file ({e})") from None
        except OSError as e:
            raise ModelError(f"{path.name}: cannot read ({e})") from None
    missing = [n for n in expected if n not in tensors]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelError(f"{model_dir}: tensor {missing[0]} is missing{more}")
    for name, t in tensors.items():
        if not t.dtype.is_floating_point:
            raise ModelError(f"tensor {name} has dtype {t.dtype}; expected floating point")
    return tensors


def to_model_names(cfg: ModelConfig, hf: dict[str, torch.Tensor | QuantWeight],
                   dtype: torch.dtype) -> dict[str, torch.Tensor | QuantWeight]:
    """Rename to our modules' names, fusing Q/K/V and gate/up into single matrices (a GGUF
    file's blocks stay blocks: read_gguf_weights).

    Gemma's RMSNorm scales by (1 + w): the 1 is added here, once, so every norm runs as LLaMA's.
    Its post_attention_layernorm norms the attention output; the MLP's input norm is
    pre_feedforward_layernorm (LLaMA calls that one post_attention_layernorm)."""
    def norm(name: str) -> torch.Tensor:
        w = hf[name].to(torch.float32)
        return (w + 1 if cfg.norm_unit_offset else w).to(dtype)

    def mat(*names: str):
        """A matrix, or several stacked by rows; one in a GGUF file's blocks stays in them."""
        ws = [hf[n] for n in names]
        if any(isinstance(w, QuantWeight) for w in ws):
            return QuantWeight.cat([w if isinstance(w, QuantWeight) else QuantWeight.of_float(w) for w in ws])
        return (torch.cat(ws) if len(ws) > 1 else ws[0]).to(dtype)

    out = {"tok_embeddings.weight": mat("model.embed_tokens.weight"),
           "norm.weight": norm("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = mat("lm_head.weight")
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[q + "attention_norm.weight"] = norm(p + "input_layernorm.weight")
        if cfg.sandwich_norms:
            out[q + "post_attention_norm.weight"] = norm(p + "post_attention_layernorm.weight")
            out[q + "ffn_norm.weight"] = norm(p + "pre_feedforward_layernorm.weight")
            out[q + "post_ffn_norm.weight"] = norm(p + "post_feedforward_layernorm.weight")
        else:
            out[q + "ffn_norm.weight"] = norm(p + "post_attention_layernorm.weight")
        out[q + "attention.wqkv.weight"] = mat(*(p + f"self_attn.{n}_proj.weight" for n in "qkv"))  # (q_dim + 2*kv_dim, hidden)
        if cfg.qkv_bias:
            out[q + "attention.bqkv"] = torch.cat([hf[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]).to(dtype)
        if cfg.qk_norm:
            out[q + "attention.q_norm.weight"] = norm(p + "self_attn.q_norm.weight")
            out[q + "attention.k_norm.weight"] = norm(p + "self_attn.k_norm.weight")
        out[q + "attention.wo.weight"] = mat(p + "self_attn.o_proj.weight")
        out[q + "feed_forward.w13.weight"] = mat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")  # (2*ffn, hidden)
        out[q + "feed_forward.w2.weight"] = mat(p + "mlp.down_proj.weight")
    return out
