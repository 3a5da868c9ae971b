"""A decode step over fixed buffers: the shape a CUDA graph needs.

A CUDA graph replays recorded kernels on the same memory, so the step it records must keep its
shapes and make no host syncs. Here the B runs decoding are padded to the next bucket of rows
(1, 2, 4, ... 64) and every run's block table to the next power of two of blocks (attention
reads that many, the rest masked); a padding row is at position 0 of the pool's scratch block,
which no run owns, so it writes and reads only that. On CUDA each (rows, blocks) bucket is
captured once (after a warm-up on a side stream) and replayed; elsewhere the same code runs
eagerly, which is how the tests check it: equal to the step the scheduler runs otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.model.attention import PagedBatch, window_decode_mask
from inference.model.family_spec import require
from inference.model.kv_cache import BLOCK_SIZE
from inference.model.transformer import Transformer
from inference.serving.kv_pool import KVPool

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket_for(rows: int) -> int | None:
    """The smallest bucket that holds `rows` decode rows; None above the largest."""
    return next((b for b in BUCKETS if b >= rows), None)


def blocks_bucket(blocks: int) -> int:
    """The block-table width for runs of at most `blocks` blocks: the next power of two."""
    return 1 << max(0, blocks - 1).bit_length()


@dataclass
class Buffers:
    """One bucket's inputs and output, at fixed addresses."""
    tokens: torch.Tensor  # (n,) int64
    positions: torch.Tensor  # (n,) int64
    slots: torch.Tensor  # (n,) int64: where each row's keys and values go
    blocks: torch.Tensor  # (n, nb) int64: each row's blocks, padded with the scratch block
    logits: torch.Tensor | None = None  # (n, vocab) float32, once the step has run


class StaticDecode:
    """Decode steps of up to BUCKETS[-1] runs, each over fixed buffers (see the module)."""

    def __init__(self, model: Transformer, pool: KVPool, capture: bool | None = None):
        require("StaticDecode", model.cfg.features(), model.cfg.family)
        self.model, self.pool = model, pool
        self.capture = model.device.type == "cuda" if capture is None else capture
        self.buffers: dict[tuple[int, int], Buffers] = {}  # by (rows, blocks) bucket
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def __call__(self, tokens: list[int], positions: list[int], slots: list[int],
                 blocks: list[list[int]]) -> torch.Tensor:
        """Logits (B, vocab) of B runs' next tokens: run b feeds tokens[b] at positions[b] into
        slots[b], over its blocks[b] (in position order). B must fit a bucket."""
        n = bucket_for(len(tokens))
        if n is None:
            raise ValueError(f"{len(tokens)} decode rows: at most {BUCKETS[-1]} in a fixed-shape step")
        key = n, blocks_bucket(max(len(held) for held in blocks))
        buf = self.buffers.get(key) or self._new_buffers(*key)
        self._fill(buf, tokens, positions, slots, blocks)
        if not self.capture:
            buf.logits = self._forward(buf)
        elif key in self.graphs:
            self.graphs[key].replay()
        else:
            self.graphs[key] = self._record(buf)
        return buf.logits[:len(tokens)]

    def _new_buffers(self, n: int, nb: int) -> Buffers:
        dev, scratch = self.model.device, self.pool.scratch_block
        long = dict(dtype=torch.long, device=dev)
        buf = Buffers(tokens=torch.zeros(n, **long), positions=torch.zeros(n, **long),
                      slots=torch.full((n,), scratch * BLOCK_SIZE, **long),
                      blocks=torch.full((n, nb), scratch, **long))
        self.buffers[n, nb] = buf
        return buf

    def _fill(self, buf: Buffers, tokens, positions, slots, blocks) -> None:
        """Copy the step's rows in; the rows after them become padding again."""
        B, (n, nb), scratch = len(tokens), buf.blocks.shape, self.pool.scratch_block
        pad = n - B
        table = torch.full((n, nb), scratch, dtype=torch.long)  # (n, nb), built on the host
        for b, held in enumerate(blocks):
            table[b, :len(held)] = torch.tensor(held, dtype=torch.long)
        host = torch.tensor([*tokens, *[0] * pad, *positions, *[0] * pad, *slots, *[scratch * BLOCK_SIZE] * pad],
                            dtype=torch.long).view(3, n)  # (3, n): tokens, positions, slots
        for dst, src in zip((buf.tokens, buf.positions, buf.slots), host):
            dst.copy_(src, non_blocking=True)
        buf.blocks.copy_(table, non_blocking=True)

    def _forward(self, buf: Buffers) -> torch.Tensor:
        """The step itself, from the buffers alone: no host value decides a shape or a branch."""
        n, context = buf.tokens.shape[0], buf.blocks.shape[1] * BLOCK_SIZE
        rows = torch.arange(n, device=buf.tokens.device)
        lengths = buf.positions + 1  # (n,) positions each row sees, its new one included
        mask = (torch.arange(context, device=rows.device)[None] < lengths[:, None]).view(n, 1, 1, context)
        window = self.model.cfg.sliding_window
        batch = PagedBatch(positions=buf.positions, write_slots=buf.slots, decode_rows=rows,
                           decode_blocks=buf.blocks, decode_mask=mask, prefills=[], logit_rows=rows,
                           window_mask=None if window is None else window_decode_mask(buf.positions, context, window))
        return self.model.forward_paged(buf.tokens, batch, self.pool.k_layers, self.pool.v_layers)

    def _record(self, buf: Buffers) -> "torch.cuda.CUDAGraph":
        """Warm up on a side stream (first-use allocations and autotuning stay out of the graph),
        then capture one step; its output buffer is replayed into from then on."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                self._forward(buf)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.inference_mode():
            buf.logits = self._forward(buf)
        graph.replay()  # the capture only recorded: this step's logits come from a replay
        return graph
