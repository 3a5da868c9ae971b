"""The page's event pump: after the first token, a batch waits once for its interval's end (or the
run's) and then takes every event that came, instead of waking at each one."""

import threading

from inference.events import PrefillEvent, StepEvent
from ui.streaming import EventPump

FOREVER = 1e6  # an interval no test waits out: a batch that ended only at its deadline would hang


def step(i: int) -> StepEvent:
    return StepEvent(i, 5, "a", "a", 1.0, 1.0, [], 0.0, 1, 100, 8192, 10.0)


def collect(pump: EventPump) -> tuple[list[list], threading.Thread]:
    """The pump's batches, gathered on a thread of their own (as the page's handler takes them)."""
    batches: list[list] = []
    reader = threading.Thread(target=lambda: batches.extend(pump.batches(lambda: FOREVER)), daemon=True)
    reader.start()
    return batches, reader


class Watched(threading.Event):
    """The pump's end-of-run event, which says when a reader starts waiting on it."""

    def __init__(self, waiting: threading.Event):
        super().__init__()
        self.waiting = waiting

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


def test_a_batch_takes_every_event_that_came_while_it_waited_and_ends_with_the_run():
    waiting = threading.Event()

    def events():
        yield PrefillEvent(16, 32)
        yield step(0)  # the first token: out at once, with what came before it
        yield step(1)
        waiting.wait()  # the reader waits out its interval: two tokens and the run's end come meanwhile
        yield step(2)
        yield step(3)

    pump = EventPump(events(), threading.Event())
    pump._ended = Watched(waiting)
    batches, reader = collect(pump)
    reader.join(60)  # the run's end wakes the reader long before its interval is out
    assert not reader.is_alive(), "the batch waited for its interval's end, not the run's"
    assert [[e.step if isinstance(e, StepEvent) else type(e).__name__ for e in b] for b in batches] == \
        [["PrefillEvent", 0], [1, 2, 3]]


def test_an_error_after_the_first_token_reaches_the_reader_with_the_events_before_it():
    go = threading.Event()

    def events():
        yield step(0)
        go.wait()
        yield step(1)
        raise RuntimeError("the run's own failure")

    pump = EventPump(events(), threading.Event())
    got, errors = [], []

    def read():
        try:
            for b in pump.batches(lambda: FOREVER):
                got.extend(b)
        except RuntimeError as e:
            errors.append(str(e))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    go.set()
    reader.join(60)
    assert not reader.is_alive()
    assert [e.step for e in got] == [0, 1] and errors == ["the run's own failure"]
