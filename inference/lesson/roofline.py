"""This machine's roofline: its peak arithmetic (FLOP/s) and memory bandwidth (bytes/s), measured
here by two loops, and where a pass of a given arithmetic intensity lies under them.

How: the peak is the best of REPEATS products of two N x N matrices at the model's dtype
(2·N³ FLOPs each); the bandwidth the best of REPEATS reads of a BANDWIDTH_MIB buffer, far larger
than any cache (each byte read once), by the faster of two reads: torch's sum of it, and the
product of it as a matrix with one vector as a decode step makes it (the engine's own kernel,
which picks its threads by their measured speed: torch's sum on two threads sharing their cores
with other programs ran several times slower than a decode step's reads). Best of, because a
shared machine's other work only ever slows a try down. Both are what this machine reaches
here, not a datasheet's figures."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from inference.model import kernels

REPEATS = 8
BANDWIDTH_MIB = 256


@dataclass(frozen=True)
class Roofline:
    peak_flops: float  # FLOP/s, measured
    bandwidth: float  # bytes/s, measured
    device: str
    dtype: str
    how: str  # the measurement, in words

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the bandwidth slope meets the compute roof."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The most FLOP/s a pass of this many FLOPs per byte can reach here."""
        return min(self.peak_flops, intensity * self.bandwidth)

    def bound(self, intensity: float) -> str:
        return "compute" if intensity >= self.ridge else "memory bandwidth"

    def to_json(self) -> dict:
        return {**asdict(self), "ridge_flops_per_byte": self.ridge}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn, device: torch.device) -> float:
    fn()  # warm-up: first-touch pages, kernel selection
    _sync(device)
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _mv(matrix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """matrix @ x as a decode step computes it: the engine's kernel where it is built, else torch's."""
    y = kernels.gemv(matrix, x) if matrix.device.type == "cpu" and matrix.dtype == torch.float32 else None
    return torch.mv(matrix, x) if y is None else y


@torch.inference_mode()
def measure(device: torch.device, dtype: torch.dtype) -> Roofline:
    """Measure this machine's roofline at `dtype` on `device` (about a second on a CPU)."""
    n = 1024 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    peak = 2 * n ** 3 / _best_seconds(lambda: a @ b, device)
    buf = torch.ones(BANDWIDTH_MIB * 2 ** 20 // dtype.itemsize, device=device, dtype=dtype)
    matrix = buf.view(-1, 1024)  # (rows, 1024): the same bytes, read as a decode step reads a weight
    x = torch.ones(1024, device=device, dtype=dtype)
    seconds = min(_best_seconds(lambda: buf.sum(), device), _best_seconds(lambda: _mv(matrix, x), device))
    bandwidth = buf.numel() * dtype.itemsize / seconds
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    name = str(dtype).removeprefix("torch.")
    how = (f"peak: best of {REPEATS} {n}×{n} @ {n}×{n} {name} matmuls (2·{n}³ FLOPs each); "
           f"bandwidth: best of {REPEATS} reads of a {BANDWIDTH_MIB} MiB {name} buffer (each byte read once; "
           "the faster of a sum and a decode step's matrix-vector product)"
           f"; torch on {device}{threads}")
    return Roofline(peak, bandwidth, str(device), name, how)
