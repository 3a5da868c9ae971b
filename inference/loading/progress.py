"""What a model's first load is doing now, for whoever waits on it (the page's status line).
The loaders say each stage with `say`; a caller that wants to hear them runs the load inside
`listening(fn)`. The listener is a context variable: each load hears its own stages only."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

_listener: ContextVar[Callable[[str], None] | None] = ContextVar("token_lab_load_listener", default=None)


def say(stage: str) -> None:
    """Tell this load's listener, if it has one, what the load does now ("fetching … with pip")."""
    fn = _listener.get()
    if fn is not None:
        fn(stage)


@contextmanager
def listening(fn: Callable[[str], None]) -> Iterator[None]:
    """Within the block, every stage said (in this thread or context) goes to fn."""
    token = _listener.set(fn)
    try:
        yield
    finally:
        _listener.reset(token)
