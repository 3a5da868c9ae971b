"""Reading a model: a Hugging Face directory (the default model and GGUF files are imported into one)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.loading.checkpoint import read_hf_weights, to_model_names
from inference.loading.gguf_import import ensure_blocks, read_blocks
from inference.model import kernels
from inference.model.config import ModelConfig
from inference.device import resolve_decode_dtype, resolve_device, resolve_dtype
from inference.errors import ModelError
from inference.model.products import resolve_products
from inference.model.transformer import Transformer
from inference.sampling.settings import from_generation_config
from inference.loading.tokenizer import Tokenizer, load_tokenizer
from inference.loading.progress import say


@dataclass
class Loaded:
    """A checkpoint read into memory: what an Engine is built from (serving/engine.py)."""
    model: Transformer
    tokenizer: Tokenizer
    name: str
    generation_defaults: dict


def load_hf_dir(model_dir: str | Path, device: str = "auto", dtype: str = "auto",
                decode_dtype: str = "same", products: str = "auto") -> Loaded:
    """decode_dtype: weights for few-row matmuls ('same', 'auto' or a dtype; see model.Linear);
    products: a quantized model's on a CPU ('auto', 'integer', 'float32': model/products.py)."""
    model_dir = Path(model_dir)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    cfg = ModelConfig.from_json(model_dir / "config.json")
    how = resolve_products(products, dev)
    blocks = quantized_source(model_dir, dev, dtype, decode_dtype)
    # The weights go straight in: held by the model alone, each read tensor is freed as soon as
    # the model has laid it out anew (Transformer.store_weights).
    form = "float32" if blocks is None else "the GGUF file's quantized blocks"
    say(f"reading its weights ({form}) and laying them out for the matmuls")
    hf = read_hf_weights(model_dir, cfg) if blocks is None else read_blocks(blocks, cfg)
    state = to_model_names(cfg, hf, dt)
    del hf  # `state` alone holds the tensors, and from_state_dict empties it
    model = Transformer.from_state_dict(cfg, state, dev, dt, resolve_decode_dtype(decode_dtype, dev, dt), how)
    say("reading its tokenizer")
    tokenizer = load_tokenizer(model_dir, cfg.bos_token_id, cfg.eos_token_ids)
    return Loaded(model, tokenizer, model_dir.name, generation_defaults(model_dir))


def quantized_source(model_dir: Path, device: torch.device, dtype: str, decode_dtype: str) -> Path | None:
    """The file of a GGUF file's quantized blocks the model computes on (gguf_import.BLOCKS_FILE),
    or None (float weights): for a directory imported from a GGUF file, on a CPU with the
    compiled kernels, at the default dtype and decode dtype (`--dtype float32` asks for the
    expanded weights)."""
    if device.type != "cpu" or dtype != "auto" or decode_dtype != "same" or not kernels.available():
        return None
    return ensure_blocks(model_dir)


def weights_bytes(model_dir: str | Path, device: str = "auto", dtype: str = "auto",
                  decode_dtype: str = "same") -> int:
    """What the model's weights will take once loaded, from its config alone (read before a
    load, to refuse one that cannot fit): every parameter at the dtype, and the matmul weights
    again at a reduced decode dtype when one is asked for, or, for a float32 model on a CPU,
    in oneDNN's layout for several rows (Transformer.keep_rows_copies, at most)."""
    cfg = ModelConfig.from_json(Path(model_dir) / "config.json")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    blocks = quantized_source(Path(model_dir), dev, dtype, decode_dtype)
    if blocks is not None:  # the blocks and the float32 tensors, as the file holds them
        return blocks.stat().st_size
    n = cfg.param_counts()
    size = n["total"] * dt.itemsize
    matmuls = n["attention"] + n["ffn"] + (n["lm_head"] or n["embedding"])
    decode = resolve_decode_dtype(decode_dtype, dev, dt)
    if decode is not None and decode != dt:
        size += matmuls * decode.itemsize
    elif dev.type == "cpu" and dt == torch.float32 and not kernels.available():  # oneDNN's copy
        size += matmuls * dt.itemsize
    return size


def generation_defaults(model_dir: Path) -> dict:
    """Sampling defaults from generation_config.json, restricted to the settings we have."""
    path = model_dir / "generation_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path.name}: {e}") from None
    return from_generation_config(data) if isinstance(data, dict) else {}
