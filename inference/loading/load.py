"""Reading a model: a Hugging Face directory (the default model and GGUF files are imported into one)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.loading.chat import turn_end_ids
from inference.loading.checkpoint import read_hf_weights, to_model_names
from inference.loading.gguf_import import gguf_source
from inference.loading.gguf_weights import read_gguf_weights, stored_bytes, types_held
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
    source, blocks = weights_source(model_dir, dev, dtype, decode_dtype)
    # The weights go straight in: held by the model alone, each read tensor is freed as soon as
    # the model has laid it out anew (Transformer.store_weights).
    form = "the GGUF file's quantized blocks" if blocks else "float32"
    say(f"reading its weights ({form}) and laying them out for the matmuls")
    hf = read_hf_weights(model_dir, cfg) if source is None else read_gguf_weights(source, cfg, blocks)
    state = to_model_names(cfg, hf, dt)
    del hf  # `state` alone holds the tensors, and from_state_dict empties it
    say(f"laying out its {len(state):,} weights in memory, in the order a step reads them")
    model = Transformer.from_state_dict(cfg, state, dev, dt, resolve_decode_dtype(decode_dtype, dev, dt), how)
    model.file_types = None if source is None else types_held(source)
    say("reading its tokenizer")
    tokenizer = load_tokenizer(model_dir, cfg.bos_token_id, cfg.eos_token_ids)
    # A chat stops where its template ends a turn, whatever token the config calls eos.
    tokenizer.eos_ids = tuple(dict.fromkeys(tokenizer.eos_ids + turn_end_ids(tokenizer)))
    return Loaded(model, tokenizer, model_dir.name, generation_defaults(model_dir))


def weights_source(model_dir: Path, device: torch.device, dtype: str, decode_dtype: str) -> tuple[Path | None, bool]:
    """(the GGUF file the weights are read from, or None: the directory's safetensors; whether
    the model computes on its quantized blocks). Blocks on a CPU with the compiled kernels, at
    the default dtype and decode dtype; float32 made from the file, tensor by tensor, where
    asked (`--dtype float32`) or needed (a GPU, no kernels). A directory imported from a GGUF
    file that is gone is refused, unless an older import left its float32 weights beside it."""
    source = gguf_source(model_dir)
    if source is None:
        if (model_dir / "gguf_source.json").exists() and not any(model_dir.glob("*.safetensors")):
            raise ModelError(f"{model_dir}: the GGUF file this model was imported from is gone; "
                             "open the .gguf file again")
        return None, False
    blocks = device.type == "cpu" and dtype == "auto" and decode_dtype == "same" and kernels.available()
    return source, blocks


def weights_bytes(model_dir: str | Path, device: str = "auto", dtype: str = "auto",
                  decode_dtype: str = "same") -> int:
    """What the model's weights will take once loaded, from its config alone (read before a
    load, to refuse one that cannot fit): every parameter at the dtype, and the matmul weights
    again at a reduced decode dtype when one is asked for, or, for a float32 model on a CPU,
    in oneDNN's layout for several rows (Transformer.keep_rows_copies, at most)."""
    cfg = ModelConfig.from_json(Path(model_dir) / "config.json")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    source, blocks = weights_source(Path(model_dir), dev, dtype, decode_dtype)
    if blocks:  # the blocks as the file holds them, the rest in float32
        return stored_bytes(source, cfg, blocks=True)
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
