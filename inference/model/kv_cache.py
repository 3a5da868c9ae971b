"""The KV cache: keys and values of every layer, preallocated once per generation."""

from __future__ import annotations

import torch

from inference.model.config import ModelConfig

BLOCK_SIZE = 16  # positions per block of the paged pool (serving/kv_pool.py)


class KVCache:
    """Static cache for `capacity` positions; `length` of them hold real keys and values.

    Keys and values are (n_layers, bsz, n_kv_heads, capacity, head_dim) so each layer's slice
    is the layout scaled_dot_product_attention takes without a copy.
    """

    def __init__(self, cfg: ModelConfig, capacity: int, device: torch.device, dtype: torch.dtype,
                 bsz: int = 1):
        shape = (cfg.n_layers, bsz, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.k: torch.Tensor | None = torch.empty(shape, device=device, dtype=dtype)
        self.v: torch.Tensor | None = torch.empty(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.length = 0
        self._bytes_per_position = bsz * cfg.kv_bytes_per_token(self.k.element_size())

    @property
    def bytes_used(self) -> int:
        return self.length * self._bytes_per_position

    @property
    def bytes_allocated(self) -> int:
        return 0 if self.k is None else self.capacity * self._bytes_per_position

    def free(self) -> None:
        """Drop the tensors now rather than when the generator is garbage-collected."""
        self.k = self.v = None
        self.length = 0
