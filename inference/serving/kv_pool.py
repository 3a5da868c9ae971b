"""The paged KV cache: one pool of fixed-size blocks shared by every run.

A run holds blocks in proportion to its tokens: it takes one more block each time it fills the
last, and gives them all back when it ends. Where a position's keys and values live is its
slot, block * BLOCK_SIZE + offset; attention gathers a run's blocks in order.

A run is admitted only when the blocks it may grow to (prompt + max new tokens) fit beside what
the runs already admitted may grow to, so a run never waits for a block in the middle.

A block may be held by several tables (the beams of one beam search share their common prefix):
the pool counts its holders, and a block goes back to the free list when its last holder gives it
back. A table about to write into a block it shares copies it first (copy on write).
"""

from __future__ import annotations

import threading

import torch

from inference.model.config import ModelConfig
from inference.device import available_memory_bytes
from inference.events import PoolStats  # noqa: F401 - re-exported: the pool is where readers look for its stats
from inference.model.kv_cache import BLOCK_SIZE



def blocks_for(positions: int) -> int:
    return -(-positions // BLOCK_SIZE)


class KVPool:
    """Keys and values of every layer for n_blocks blocks, and which blocks are free.

    k, v: (n_layers, (n_blocks + 1) * BLOCK_SIZE, n_kv_heads, head_dim): a layer's slots in one
    tensor, so writing new positions is one index_copy_ and gathering a run's is one index.
    """

    def __init__(self, cfg: ModelConfig, n_blocks: int, device: torch.device, dtype: torch.dtype):
        if n_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        # One block more than handed out: the scratch block, which the padding rows of a
        # fixed-shape step (static_step.py) write and read, and no run owns.
        shape = (cfg.n_layers, (n_blocks + 1) * BLOCK_SIZE, cfg.n_kv_heads, cfg.head_dim)
        # empty, not zeros: untouched pages cost no memory until a run writes them.
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.n_blocks = n_blocks
        self.scratch_block = n_blocks
        # Each layer's (slots, n_kv_heads, head_dim) view, made once: a step indexes 2 x layers.
        self.k_layers, self.v_layers = list(self.k.unbind(0)), list(self.v.unbind(0))
        self.bytes_per_block = BLOCK_SIZE * cfg.kv_bytes_per_token(self.k.element_size())
        self._free = list(range(n_blocks - 1, -1, -1))  # pop() hands out low blocks first
        self._holders = [0] * n_blocks  # tables (or prefix-cache entries) holding each block
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            block = self._free.pop()  # admission guarantees one is there
            self._holders[block] = 1
        # Zeroed: attention reads a run's last block whole, its unwritten tail masked out, and
        # a masked weight of 0 times never-written memory (possibly NaN) would still be NaN.
        self.k[:, block * BLOCK_SIZE:(block + 1) * BLOCK_SIZE].zero_()
        self.v[:, block * BLOCK_SIZE:(block + 1) * BLOCK_SIZE].zero_()
        return block

    def give_back(self, blocks: list[int]) -> None:
        """One holder lets go of each block; a block nobody holds any more is free again."""
        with self._lock:
            for block in reversed(blocks):
                self._holders[block] -= 1
                if self._holders[block] == 0:
                    self._free.append(block)

    def share(self, blocks: list[int]) -> None:
        """One more holder of each block (a beam forked from another holds its blocks too)."""
        with self._lock:
            for block in blocks:
                self._holders[block] += 1

    def holders(self, block: int) -> int:
        return self._holders[block]

    def copy_block(self, src: int, dst: int) -> None:
        """Every layer's keys and values of block src into block dst."""
        a, b = src * BLOCK_SIZE, dst * BLOCK_SIZE
        self.k[:, b:b + BLOCK_SIZE] = self.k[:, a:a + BLOCK_SIZE]
        self.v[:, b:b + BLOCK_SIZE] = self.v[:, a:a + BLOCK_SIZE]

    @property
    def blocks_used(self) -> int:
        return self.n_blocks - len(self._free)


class BlockTable:
    """One run's blocks, in position order, and the pool slot of each of its positions."""

    def __init__(self, pool: KVPool, capacity: int, device: torch.device):
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0  # positions written
        # slot_of[p]: where position p lives; filled a block at a time as blocks are taken, so a
        # step reads its slots as a slice instead of computing them.
        self._slot_of = torch.empty(blocks_for(capacity) * BLOCK_SIZE, dtype=torch.long, device=device)
        self._offsets = torch.arange(BLOCK_SIZE, device=device)

    def grow_to(self, positions: int) -> None:
        while len(self.blocks) * BLOCK_SIZE < positions:
            block = self.pool.take()
            start = len(self.blocks) * BLOCK_SIZE
            self._slot_of[start:start + BLOCK_SIZE] = self._offsets + block * BLOCK_SIZE
            self.blocks.append(block)

    def slots(self, start: int, end: int) -> torch.Tensor:
        """Pool slots of positions start..end-1, (end - start,) int64 (a view)."""
        return self._slot_of[start:end]

    def adopt(self, blocks: list[int]) -> None:
        """Start with blocks whose keys and values are already written (a cached prefix)."""
        assert not self.blocks
        for i, block in enumerate(blocks):
            self._slot_of[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE] = self._offsets + block * BLOCK_SIZE
        self.blocks = list(blocks)
        self.length = len(blocks) * BLOCK_SIZE

    def release(self) -> None:
        if self.blocks:
            self.pool.give_back(self.blocks)
        self.blocks = []

    def fork(self) -> "BlockTable":
        """A table holding the same blocks (each now held once more) and positions: a beam that
        continues this one. Neither writes into a block the other holds (own_from)."""
        other = BlockTable.__new__(BlockTable)
        other.pool, other._offsets = self.pool, self._offsets
        other.blocks, other.length = list(self.blocks), self.length
        other._slot_of = self._slot_of.clone()
        self.pool.share(self.blocks)
        return other

    def own_from(self, position: int) -> int:
        """Copy on write: every block from the one holding `position` on that another table
        holds too is replaced by a copy of its own. Returns the blocks copied."""
        copied = 0
        for i in range(position // BLOCK_SIZE, len(self.blocks)):
            old = self.blocks[i]
            if self.pool.holders(old) > 1:
                new = self.pool.take()
                self.pool.copy_block(old, new)
                self.pool.give_back([old])
                self.blocks[i] = new
                self._slot_of[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE] = self._offsets + new * BLOCK_SIZE
                copied += 1
        return copied


# Finished runs whose blocks the prefix cache keeps, the latest. A chat's next turn finds its
# conversation if fewer than this many other runs ended meanwhile (on a 2-core CPU serving 8 runs
# at once, a couple of minutes of a busy page). Without a bound the cache
# kept every finished run's blocks until the pool was full: on a CPU, where the pool's pages are
# committed only once written, the server's memory grew by each run's blocks (~0.7 MiB for
# SmolLM2's 24-token runs of short prompts) up to the whole pool, a quarter of the machine's.
PREFIX_ENTRIES = 32


class PrefixCache:
    """Whole blocks of finished runs, by the tokens whose keys and values they hold, for a later
    prompt that starts with the same tokens: a chat's next turn, which repeats the conversation
    so far, reads only what is new. Cached blocks are given back to the pool whenever a run
    needs them, and beyond max_entries runs (oldest first)."""

    def __init__(self, pool: KVPool, max_entries: int = PREFIX_ENTRIES):
        self.pool, self.max_entries = pool, max_entries
        # (token ids held, blocks), oldest first: at most max_entries, each holding at least one
        # block of the pool and the ids of the positions its blocks hold, no more.
        self._entries: list[tuple[list[int], list[int]]] = []

    @property
    def blocks(self) -> int:
        return sum(len(blocks) for _, blocks in self._entries)

    def keep(self, ids: list[int], blocks: list[int]) -> None:
        """Keep the whole blocks of a finished run (ids: the tokens its cache holds, in order);
        the partly filled last one goes back to the pool."""
        whole = min(len(ids) // BLOCK_SIZE, len(blocks))
        self.pool.give_back(blocks[whole:])
        if whole:
            self._entries.append((ids[:whole * BLOCK_SIZE], blocks[:whole]))
        while len(self._entries) > self.max_entries:
            self.pool.give_back(self._entries.pop(0)[1])

    def take_prefix(self, ids: list[int]) -> list[int]:
        """The cached blocks that hold the most whole blocks at the start of ids, taken out of
        the cache (the rest of their entry goes back to the pool). At least the prompt's last
        token is left to read: its logits give the first new token."""
        most = (len(ids) - 1) // BLOCK_SIZE
        best, best_n = None, 0
        for i, (held, _) in enumerate(self._entries):
            n = 0
            while n < min(most, len(held) // BLOCK_SIZE) and \
                    held[n * BLOCK_SIZE:(n + 1) * BLOCK_SIZE] == ids[n * BLOCK_SIZE:(n + 1) * BLOCK_SIZE]:
                n += 1
            if n > best_n:
                best, best_n = i, n
        if best is None:
            return []
        _, blocks = self._entries.pop(best)
        self.pool.give_back(blocks[best_n:])
        return blocks[:best_n]

    def evict(self, n_blocks: int) -> None:
        """Give at least n_blocks back to the pool, oldest entries first (or all there are)."""
        while n_blocks > 0 and self._entries:
            _, blocks = self._entries.pop(0)
            self.pool.give_back(blocks)
            n_blocks -= len(blocks)


def default_pool_blocks(cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                        pool_mib: float | None = None) -> int:
    """Blocks for the pool: pool_mib when given; else a quarter of the memory available (on a
    GPU, half of what is free after the weights), at most what 16 full-context runs need."""
    per_block = BLOCK_SIZE * cfg.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
    if pool_mib is not None:
        budget = pool_mib * 2**20
    elif device.type == "cuda":
        budget = torch.cuda.mem_get_info(device)[0] / 2
    else:
        budget = available_memory_bytes() / 4
    most = 16 * blocks_for(cfg.max_seq_len)
    return max(1, min(int(budget // per_block), most))
