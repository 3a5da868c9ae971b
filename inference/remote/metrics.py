"""The model server's own numbers, from its Prometheus /metrics: what the whole server (every
request, every visitor) holds in its KV cache right now, and the size of that cache."""

from __future__ import annotations

import re
from dataclasses import dataclass

# One sample line: name{label="value",...} number
_SAMPLE = re.compile(r'^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Bytes per value of the KV cache's dtype names, as vLLM's --kv-cache-dtype and --dtype spell them.
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}


@dataclass(frozen=True)
class ServerLoad:
    """None where the server does not publish the number."""
    kv_cache_usage: float | None  # fraction of the server's KV-cache pool in use, 0..1
    running: int | None  # requests being decoded now
    waiting: int | None  # requests queued
    pool_tokens: int | None  # positions the pool holds (blocks x block size)
    pool_bytes: int | None  # bytes of the pool, where the server says
    cache_dtype: str | None  # --kv-cache-dtype; "auto" = the model's dtype


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def parse_load(text: str, model: str | None = None) -> ServerLoad:
    """vllm:kv_cache_usage_perc (a fraction despite its name), vllm:num_requests_running and
    _waiting summed over the server's engines (data-parallel ranks), and the pool's size from
    vllm:cache_config_info. Only samples of `model`, where a sample names its model."""
    usage, running, waiting, info = [], [], [], {}
    for name, labels, value in samples(text):
        if model is not None and labels.get("model_name", model) != model:
            continue
        if name == "vllm:kv_cache_usage_perc":
            usage.append(value)
        elif name == "vllm:num_requests_running":
            running.append(value)
        elif name == "vllm:num_requests_waiting":
            waiting.append(value)
        elif name == "vllm:cache_config_info" and not info:
            info = labels
    blocks, block_size = _int(info.get("num_gpu_blocks")), _int(info.get("block_size"))
    tokens = _int(info.get("kv_cache_size_tokens")) or (blocks * block_size if blocks and block_size else None)
    return ServerLoad(
        kv_cache_usage=sum(usage) / len(usage) if usage else None,
        running=int(sum(running)) if running else None,
        waiting=int(sum(waiting)) if waiting else None,
        pool_tokens=tokens,
        pool_bytes=_int(info.get("kv_cache_memory_bytes")),
        cache_dtype=info.get("cache_dtype"))


def kv_bytes_per_value(load: ServerLoad | None, values_per_token: int | None,
                       config_dtype: str | None) -> tuple[int | None, str]:
    """Bytes per KV value, and where that number comes from: the server's --kv-cache-dtype
    when set, else its pool's bytes per position over the values each position holds (when that
    is a whole 1, 2 or 4), else the model config's dtype. (None, why) when nothing says."""
    if load is not None and load.cache_dtype and load.cache_dtype != "auto":
        b = DTYPE_BYTES.get(load.cache_dtype.lower())
        if b:
            return b, f"the server's KV-cache dtype {load.cache_dtype}"
    if load is not None and load.pool_bytes and load.pool_tokens and values_per_token:
        ratio = load.pool_bytes / load.pool_tokens / values_per_token
        for b in (4, 2, 1):
            if abs(ratio - b) < 0.02 * b:
                return b, (f"the server's KV-cache pool: {load.pool_bytes:,} bytes for "
                           f"{load.pool_tokens:,} positions")
    if config_dtype:
        b = DTYPE_BYTES.get(config_dtype.lower())
        if b:
            return b, f"config.json's dtype {config_dtype}"
    return None, "neither the server's metrics nor config.json say the KV-cache dtype"


def _int(text) -> int | None:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None
