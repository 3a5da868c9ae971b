"""How a run's forward passes are made: one interface, an eager and a compiled implementation.

A decoder lends a run its KV cache, runs the prefill and each decode step against it, and takes
the cache back at the end. The cache owns the position: `cache.length` positions are filled, so
the next token goes at position `cache.length`.
"""

from __future__ import annotations

import torch

from .kv_cache import KVCache
from .model import Transformer


class EagerDecoder:
    """Plain PyTorch forward passes; each run gets a fresh cache, freed at the end."""

    def __init__(self, model: Transformer):
        self.model = model

    def new_cache(self, needed: int) -> KVCache:
        return self.model.new_cache(needed)

    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (1, vocab) after the prompt tokens (1, T)."""
        return self.model(tokens, cache, cache.length)

    def step(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (1, vocab) after one more token (1, 1)."""
        return self.model(token, cache, cache.length)

    def release(self, cache: KVCache) -> None:
        cache.free()

    @property
    def held_bytes(self) -> int:
        """Memory of caches kept between runs: none."""
        return 0
