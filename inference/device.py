"""Choosing the device and dtype: CUDA when present, bfloat16 there and float32 on the CPU."""

from __future__ import annotations

import os

import torch

from inference.errors import InputError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {name!r} requested but CUDA is not available here")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise InputError(f"unknown dtype {name!r} (use auto, {', '.join(DTYPES)})")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_decode_dtype(name: str, device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """Weights for the bandwidth-bound decode step: 'auto' halves them on a float32 CPU model."""
    if name == "same":
        return None
    if name == "auto":
        return torch.bfloat16 if device.type == "cpu" and dtype == torch.float32 else None
    return resolve_dtype(name, device)


def available_memory_bytes() -> int:
    """The memory this machine has available now (MemAvailable), in bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
