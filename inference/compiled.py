"""The decode step compiled with torch.compile (CUDA graphs on a GPU), and its static caches.

At batch 1 a decode step is ~20 small kernels per layer; on a GPU, launching them from Python
takes longer than running them. Compiled with mode="reduce-overhead" the whole step becomes one
CUDA graph replay. That needs every shape and address fixed from step to step, so the step is
`Transformer.decode_static` (the position is a tensor, attention covers the cache's capacity)
and caches come in a few capacities (powers of two) and are kept and reused between runs: a new
capacity costs one compilation, a new cache one graph recording.
"""

from __future__ import annotations

import threading

import torch

from .decoding import EagerDecoder
from .kv_cache import KVCache
from .model import Transformer

MIN_CAPACITY = 256


def capacity_bucket(needed: int, max_len: int) -> int:
    """The smallest power of two >= needed (at least MIN_CAPACITY), capped at max_len."""
    cap = MIN_CAPACITY
    while cap < needed:
        cap *= 2
    return min(cap, max_len)


class CompiledDecoder(EagerDecoder):
    """Decode steps compiled; caches in power-of-two capacities, lent per run and kept for the
    next. The prefill stays eager: its shape changes with every prompt."""

    def __init__(self, model: Transformer, backend: str = "inductor"):
        super().__init__(model)
        mode = "reduce-overhead" if model.device.type == "cuda" and backend == "inductor" else None
        # dynamic=False: one graph per cache capacity, never a shape-generic one.
        self._step = torch.compile(model.decode_static, backend=backend, mode=mode, fullgraph=True,
                                   dynamic=False)
        self._free: dict[int, list[KVCache]] = {}
        self._lock = threading.Lock()

    def new_cache(self, needed: int) -> KVCache:
        cap = capacity_bucket(needed, self.model.cfg.max_seq_len)
        with self._lock:
            pool = self._free.setdefault(cap, [])
            if pool:
                cache = pool.pop()
                cache.length = 0
                return cache
        cache = self.model.new_cache(cap)
        # The position lives on the device too: fill_ launches a kernel, torch.tensor([pos])
        # would copy from the host and wait for the device every step.
        cache.position = torch.zeros(1, dtype=torch.long, device=self.model.device)
        # Positions past the current one are masked, but a masked NaN still poisons the sum
        # (0 * NaN): start from zeros, not from whatever the allocator hands over.
        cache.k.zero_()
        cache.v.zero_()
        # Graphs read the cache at a fixed address: tell the compiler it stays put.
        torch._dynamo.mark_static_address(cache.k)
        torch._dynamo.mark_static_address(cache.v)
        torch._dynamo.mark_static_address(cache.position)
        return cache

    def release(self, cache: KVCache) -> None:
        """Keep the cache for the next run: the compiled graphs know its address."""
        if cache.k is None:  # freed after an error
            return
        with self._lock:
            self._free.setdefault(cache.capacity, []).append(cache)

    def step(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (bsz, vocab) for token (bsz, 1) at the cache's next position; advances it."""
        cache.position.fill_(cache.length)
        logits = self._step(token, cache.position, cache.k, cache.v)
        cache.length += 1
        if self.model.device.type == "cuda":
            logits = logits.clone()  # a graph's output is overwritten by its next replay
        return logits

    @property
    def held_bytes(self) -> int:
        """Memory of the caches kept for reuse between runs."""
        with self._lock:
            return sum(c.bytes_allocated for pool in self._free.values() for c in pool)
