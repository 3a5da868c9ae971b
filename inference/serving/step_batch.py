"""A step's rows as the model reads them: the eager PagedBatch of any mix of decode rows and
prompt chunks, and the fixed-shape step's slots and blocks (static_step.py)."""

from __future__ import annotations

import torch

from inference.model.transformer import PagedBatch
from inference.serving.kv_pool import BLOCK_SIZE, BlockTable, blocks_for


def eager_batch(positions, slots, decode, prefills, sampling, dev) -> PagedBatch:
    """The eager step's batch: positions and write slots of every row; decode rows (row, table,
    length) with their blocks; prompt chunks; the rows whose logits are sampled."""
    batch = PagedBatch(
        positions=torch.tensor(positions, device=dev), write_slots=torch.cat(slots),
        decode_rows=None, decode_blocks=None, decode_mask=None, prefills=prefills,
        logit_rows=torch.tensor([row for row, _ in sampling], dtype=torch.long, device=dev))
    if decode:
        batch.decode_rows = torch.tensor([row for row, _, _ in decode], device=dev)
        batch.decode_blocks, batch.decode_mask = decode_context(decode, dev)
    return batch


def static_rows(decode: list[tuple[int, BlockTable, int]]) -> tuple[list[int], list[list[int]]]:
    """Each decode row's write slot and blocks, from the host's block tables (no read of a device
    tensor: the fixed-shape step makes no host sync)."""
    slots, blocks = [], []
    for _, table, n in decode:
        held = table.blocks[:blocks_for(n)]
        slots.append(held[(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE)
        blocks.append(held)
    return slots, blocks


def decode_context(decode: list[tuple[int, BlockTable, int]], dev) -> tuple[torch.Tensor | slice, torch.Tensor | None]:
    """Each decode row's blocks (B, nb), padded, and the mask of its positions.

    One run whose blocks are consecutive in the pool is read in place, as a slice of slots,
    without a mask (SDPA then takes its fastest kernel)."""
    if len(decode) == 1:
        _, table, n = decode[0]
        blocks = table.blocks
        if blocks == list(range(blocks[0], blocks[0] + len(blocks))):
            return slice(blocks[0] * BLOCK_SIZE, blocks[0] * BLOCK_SIZE + n), None
    nb = max(blocks_for(n) for _, _, n in decode)
    ctx = torch.empty(len(decode), nb, dtype=torch.long)  # (B, nb)
    mask = torch.zeros(len(decode), 1, 1, nb * BLOCK_SIZE, dtype=torch.bool)  # (B, 1, 1, nb * BLOCK_SIZE)
    for b, (_, table, n) in enumerate(decode):
        held = table.blocks[:blocks_for(n)]
        ctx[b] = torch.tensor(held + [held[0]] * (nb - len(held)))  # padding: any block, masked out
        mask[b, ..., :n] = True
    return ctx.to(dev), mask.to(dev)
