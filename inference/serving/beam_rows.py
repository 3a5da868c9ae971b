"""A beam search inside the scheduler's step: a decode row per live beam, and the search's step
from those rows' logits (decoding/beams.py chooses; this keeps the beams' block tables). A tree of
continuations (decoding/tree.py) runs the same way: its live beams are the nodes still to expand."""

from __future__ import annotations

import time

import torch

from inference.serving.run import Run, tables_of


def beam_rows(run: Run, tokens, positions, slots, decode, sampling) -> None:
    """Add a decode row per live beam, each into its own table (a block it shares with another
    beam is copied first). Raises where the pool cannot grow a beam: the search ends there."""
    live = run.beams.live
    run.copied = 0
    for beam in live:
        run.copied += beam.table.own_from(beam.table.length)
        beam.table.grow_to(beam.table.length + 1)
    for beam in live:
        start, row = beam.table.length, len(tokens)
        tokens.append(beam.last)
        positions.append(start)
        slots.append(beam.table.slots(start, start + 1))
        decode.append((row, beam.table, start + 1))
        beam.table.length = start + 1
        sampling.append((row, run))


def beam_step(run: Run, logits: torch.Tensor, lock, pool_stats, tokenizer) -> None:
    """The search's step from its rows of logits: the continuations kept fork their parents'
    tables (sharing every block), the parents' are let go (under `lock`, the pool's), and the
    step's event. pool_stats(): the pool's numbers, taken under the lock."""
    search = run.beams
    parents = [b.table for b in search.live] if search.live else [run.table]
    with torch.inference_mode():
        hyps = [h for h, _ in search.step(logits)]
    with lock:
        for beam, h in zip(search.live, sorted((h for h in hyps if h.status == "kept"), key=lambda h: h.beam)):
            beam.table = parents[h.parent].fork()
        for table in parents:
            table.release()
        run.table = None
    now = time.perf_counter()
    ms = (now - run.last_step_end) * 1000
    run.last_step_end = now
    run.step_ms.append(ms)
    held = [t.blocks for t in tables_of(run)]
    with lock:
        pool = pool_stats()
    run.events.put(search.step_event(hyps, [tokenizer.piece(h.token_id) for h in hyps], ms,
                                     len({b for blocks in held for b in blocks}), sum(len(blocks) for blocks in held),
                                     run.copied, pool))
    run.copied = 0
