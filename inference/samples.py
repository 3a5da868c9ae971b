"""Many samples of one prompt: N runs with seeds s, s+1, ..., s+N-1, whose events come merged
as (k, event), k the sample. Sample k is the run a single generate with seed s+k makes."""

from __future__ import annotations

import queue
from typing import Iterator

from inference.errors import InputError, shown
from inference.events import DoneEvent
from inference.request import choose_seed

MAX_SAMPLES = 64
SEED_END = 2**63  # seeds are in [0, 2^63), as SamplingParams checks


def first_seed(seed: int | None, n) -> int:
    """Check n (1..MAX_SAMPLES) and the seeds s..s+n-1; s is `seed`, or random when None."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
        raise InputError(f"the number of samples must be a whole number from 1 to {MAX_SAMPLES}, got {shown(n)}")
    s = choose_seed(seed)
    if s + n > SEED_END:
        raise InputError(f"seeds {s}..{s + n - 1} pass 2^63 - 1: use a seed of at most {SEED_END - n}")
    return s


class Tagged:
    """A run's event queue, as the scheduler sees it, that puts (k, event) on the queue a batch
    of samples shares: one reader waits on one queue for all of them."""

    def __init__(self, shared: queue.Queue, k: int):
        self.shared, self.k = shared, k

    def put(self, item) -> None:
        self.shared.put((self.k, item))


def merged(shared: queue.Queue, n: int) -> Iterator[tuple[int, object]]:
    """(k, event) from `shared` until each of the n samples has ended; an exception a sample
    put there (its run failed) is raised."""
    ended = 0
    while ended < n:
        k, ev = shared.get()
        if isinstance(ev, BaseException):
            raise ev
        yield k, ev
        if isinstance(ev, DoneEvent):
            ended += 1
