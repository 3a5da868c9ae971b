"""One request's state while the scheduler owns it, and how a step's prompt budget is shared."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from inference.decoding.beams import BeamSearch
from inference.decoding.tree import TreeSearch
from inference.sampling.params import SamplingParams
from inference.sampling.state import RunState
from inference.serving.kv_pool import BlockTable
from inference.serving.stop import StopMatcher


@dataclass(eq=False)
class Run:
    """One request's state while the scheduler owns it. Its events go to `events`."""
    ids: list[int]
    params: SamplingParams
    top_n: int
    cancel: threading.Event
    max_new: int
    capped: bool
    seed: int
    blocks_needed: int
    # Where its events go: its own queue, or a batch of samples' shared one (engine.Tagged).
    events: queue.Queue = field(default_factory=queue.Queue)
    keep_prefix: bool = True  # its whole blocks go to the prefix cache when it ends (not cancelled)
    released: threading.Event = field(default_factory=threading.Event)
    table: BlockTable | None = None
    generator: torch.Generator | None = None
    state: RunState | None = None  # what its sampling stages read; advanced after each token
    stream: object = None
    stops: StopMatcher | None = None
    prefilled: int = 0  # prompt positions in the cache
    reused: int = 0  # of those, positions found in the prefix cache (not computed by this run)
    generated: list[int] = field(default_factory=list)  # sampled tokens, in order
    next_token: int | None = None  # sampled, not yet fed back
    parts: list[str] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    submitted: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    last_step_end: float | None = None
    wait_position: int | None = None
    given: int = 0  # of `ids`, the last ones already generated (a branch's): its stages count them
    beams: BeamSearch | TreeSearch | None = None  # a beam search (or a tree): a decode row per live beam, each its own table
    copied: int = 0  # a beam search's blocks copied on write this step
    forced: tuple[int, ...] = ()  # the tokens it makes, in order (RunRequest.forced), else sampled
    emptied_by: str | None = None  # reason "constraint": the stage that removed the last allowed token
    costs: list[tuple[float, float]] = field(default_factory=list)  # a constrained run's (prob, free prob) per token

    @property
    def n_prompt(self) -> int:
        return len(self.ids)


def fair_shares(unread: dict, budget: int) -> dict:
    """Prompt tokens each run still reading its prompt reads this step ({run: tokens unread} ->
    {run: tokens}): the budget split evenly, a run that needs less than its part taking only what
    it needs and leaving the rest to the others. So a short prompt is read at once beside a long
    one (given the whole budget in turn, it waited for every chunk of the long one)."""
    shares, left = {}, len(unread)
    for run, need in sorted(unread.items(), key=lambda kv: kv[1]):  # the smallest first: leftovers go on
        shares[run] = min(need, max(budget // left, 1 if budget else 0))
        budget, left = budget - shares[run], left - 1
    return shares


def prefill_shares(runs, budget: int) -> dict:
    """fair_shares of the runs (by id()) still reading their prompt."""
    return fair_shares({id(r): r.n_prompt - r.prefilled for r in runs if r.prefilled < r.n_prompt}, budget)


def tables_of(run: Run) -> list[BlockTable]:
    """Every block table a run holds: its own, and a beam search's live beams'."""
    beams = [b.table for b in run.beams.live if b.table is not None] if run.beams is not None else []
    return ([run.table] if run.table is not None else []) + beams
