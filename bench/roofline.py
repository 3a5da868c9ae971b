"""The memory limit of a decode step: the bandwidths measured on this machine, the bytes a step of
any number of rows reads, and the fraction of its read-bound time a measured step reaches
(bytes a step reads / read bandwidth measured beside it, against the step's measured time).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.model.anatomy import decode_cost
from inference.model.arena import Arena


def copy_bandwidth_gbs(device: torch.device, mib: int = 256) -> float:
    """Bytes moved (read + written) per second by a large tensor copy: the memory roofline."""
    a = torch.empty(mib * 2**20 // 4, device=device)
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    sync(device)
    t = time.perf_counter()
    n = 10
    for _ in range(n):
        b.copy_(a)
    sync(device)
    return 2 * a.numel() * 4 * n / (time.perf_counter() - t) / 1e9


def read_bandwidth_gbs(device: torch.device, mib: int = 1024) -> float:
    """Bytes read per second by summing a tensor larger than the CPU's last-level cache: what a
    decode step, which reads every weight once, can at best stream its weights at. On a CPU the
    tensor lies in memory as the weights do (an arena of 2 MiB pages, inference/model/arena.py),
    which two threads read ~1.6x faster than 4 KiB pages here. On a GPU: its HBM's."""
    n = mib * 2**20 // 4
    if device.type == "cpu":
        a = Arena(n * 4).empty((n,), torch.float32).fill_(1.0)
    else:
        a = torch.ones(n, device=device)
    a.sum()
    sync(device)
    t = time.perf_counter()
    n = 5
    for _ in range(n):
        a.sum()
    sync(device)
    return a.numel() * 4 * n / (time.perf_counter() - t) / 1e9


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class StepReads:
    """What a decode step reads: the weights once, whatever its rows, and each row's own bytes
    (its KV cache at the context length, its embedding row)."""
    weights: int
    per_row: int

    def at(self, rows: int) -> int:
        return self.weights + rows * self.per_row


def engine_reads(engine, context_len: int) -> StepReads:
    """Our engine's step: its weights at the decode dtype's width or as stored blocks, its KV
    cache at the model's dtype (anatomy.decode_cost: the figure the page shows for one row)."""
    info = engine.describe()
    kv_b = engine.dtype.itemsize
    one = decode_cost(engine.cfg, context_len, info.decode_dtype.itemsize, kv_b, info.stored_bytes).bytes
    embed_row = (info.stored_bytes or {}).get("embed_row", engine.cfg.hidden_size * info.decode_dtype.itemsize)
    per_row = engine.cfg.kv_bytes_per_token(kv_b) * context_len + embed_row
    return StepReads(one - per_row, per_row)


def gguf_reads(path: Path, cfg, context_len: int, kv_bytes_per_value: int = 2) -> StepReads:
    """llama.cpp's step on a GGUF file: every tensor of the file as stored, but of the embedding
    table (when the file has an output matrix) one row a step; its KV cache at float16, its
    default."""
    import gguf

    sizes = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    embed = sizes.pop("token_embd.weight")
    embed_row = embed // cfg.vocab_size
    weights = sum(sizes.values()) + (0 if "output.weight" in sizes else embed)  # tied: read whole as the head
    return StepReads(weights, cfg.kv_bytes_per_token(kv_bytes_per_value) * context_len + embed_row)


def fraction(step_bytes: int, step_ms: float, read_gbs: float) -> float:
    """The step's read-bound time (its bytes at the read bandwidth) over its measured time: 1.0
    is a step that only streams its bytes."""
    return step_bytes / (read_gbs * 1e9) * 1000 / step_ms


def by_round(step_bytes: int, step_ms: list[float], reads_gbs: list[float]) -> dict:
    """Each round's fraction against the bandwidth read beside that round, and their median."""
    each = [fraction(step_bytes, ms, gbs) for ms, gbs in zip(step_ms, reads_gbs)]
    return {"read_bound_fraction": statistics.median(each), "read_bound_fraction_by_round": each,
            "step_bytes": step_bytes}
