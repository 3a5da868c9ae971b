"""Loading Hugging Face checkpoints of the families we run from safetensors, every tensor checked first."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from inference.model.config import ModelConfig
from inference.model.family_spec import HF_MATRICES, SPECS
from inference.errors import ModelError
from inference.model.quant import QuantWeight

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def layer_tensors(cfg: ModelConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A layer's tensors in a Hugging Face checkpoint of cfg's family (family_spec.py): role ->
    (suffix after model.layers.N., shape)."""
    spec = SPECS[cfg.family]
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes = {"q_proj": (cfg.q_dim, h), "k_proj": (cfg.kv_dim, h), "v_proj": (cfg.kv_dim, h),
              "qkv_proj": (cfg.q_dim + 2 * cfg.kv_dim, h), "o_proj": (h, cfg.q_dim),
              "gate_proj": (f, h), "up_proj": (f, h), "gate_up_proj": (2 * f, h), "down_proj": (h, f)}
    out = {role: (suffix + ".weight", (h,)) for role, suffix in spec.norms.items()}
    out.update({role: (HF_MATRICES[role] + ".weight", shapes[role]) for role in spec.matrices()})
    if cfg.qkv_bias:
        out.update({f"{n}_bias": (f"self_attn.{n}_proj.bias", (dim,)) for n, dim in
                    (("q", cfg.q_dim), ("k", cfg.kv_dim), ("v", cfg.kv_dim))})
    if cfg.qk_norm or cfg.qk_norm_full:
        full = cfg.qk_norm_full
        out["q_norm"] = ("self_attn.q_norm.weight", (cfg.q_dim if full else d,))
        out["k_norm"] = ("self_attn.k_norm.weight", (cfg.kv_dim if full else d,))
    return out


def expected_hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of cfg's family must hold, with its shape."""
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    per_layer = layer_tensors(cfg)
    for i in range(cfg.n_layers):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in per_layer.values()})
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
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
    Which Hugging Face norm is which of ours is the family's (family_spec.FamilySpec.norms)."""
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
    per_layer = layer_tensors(cfg)
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        name = {role: p + suffix for role, (suffix, _) in per_layer.items()}
        for role in SPECS[cfg.family].norms:  # attention_norm, ffn_norm, post_attention_norm, post_ffn_norm
            out[q + role + ".weight"] = norm(name[role])
        fused = "qkv_proj" in name  # Phi-3 stores Q/K/V and gate/up fused, as our modules hold them
        out[q + "attention.wqkv.weight"] = mat(name["qkv_proj"]) if fused else \
            mat(name["q_proj"], name["k_proj"], name["v_proj"])  # (q_dim + 2*kv_dim, hidden)
        if cfg.qkv_bias:
            out[q + "attention.bqkv"] = torch.cat([hf[name[f"{n}_bias"]] for n in "qkv"]).to(dtype)
        if "q_norm" in name:
            out[q + "attention.q_norm.weight"] = norm(name["q_norm"])
            out[q + "attention.k_norm.weight"] = norm(name["k_norm"])
        out[q + "attention.wo.weight"] = mat(name["o_proj"])
        out[q + "feed_forward.w13.weight"] = mat(name["gate_up_proj"]) if fused else \
            mat(name["gate_proj"], name["up_proj"])  # (2*ffn, hidden): [gate; up]
        out[q + "feed_forward.w2.weight"] = mat(name["down_proj"])
    return out
