"""Loading Hugging Face LLaMA checkpoints from safetensors, with every tensor checked first."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from inference.model.config import ModelConfig
from inference.errors import ModelError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def expected_hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face LlamaForCausalLM checkpoint must hold, with its shape."""
    h, f = cfg.hidden_size, cfg.intermediate_size
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
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


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
                for name in f.keys():
                    if name.endswith(IGNORABLE_SUFFIXES):
                        continue
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue  # tied: the head is the embedding matrix by definition
                    if name not in expected:
                        raise ModelError(f"{path.name}: unexpected tensor {name!r} "
                                         "for a LLaMA model with this config")
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != expected[name]:
                        raise ModelError(f"{path.name}: tensor {name} has shape {list(shape)}, "
                                         f"config.json implies {list(expected[name])}")
                    tensors[name] = f.get_tensor(name)
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


def to_model_names(cfg: ModelConfig, hf: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Rename to our modules' names, fusing Q/K/V and gate/up into single matrices."""
    out = {"tok_embeddings.weight": hf["model.embed_tokens.weight"].to(dtype),
           "norm.weight": hf["model.norm.weight"].to(dtype)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = hf["lm_head.weight"].to(dtype)
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[q + "attention_norm.weight"] = hf[p + "input_layernorm.weight"].to(dtype)
        out[q + "ffn_norm.weight"] = hf[p + "post_attention_layernorm.weight"].to(dtype)
        out[q + "attention.wqkv.weight"] = torch.cat(
            [hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]).to(dtype)  # (q_dim + 2*kv_dim, hidden)
        out[q + "attention.wo.weight"] = hf[p + "self_attn.o_proj.weight"].to(dtype)
        out[q + "feed_forward.w13.weight"] = torch.cat(
            [hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]]).to(dtype)  # (2*ffn, hidden)
        out[q + "feed_forward.w2.weight"] = hf[p + "mlp.down_proj.weight"].to(dtype)
    return out
