"""A run's failure is that run's alone. For each place a run can fail (its start, a sampler stage,
the constraint matcher, detokenizing, a stop string, its end) a fault is injected into one run of
several admitted together: that run ends with its error, the others' tokens equal their runs
alone, the pool returns to empty, and the engine serves the next run. A fault of the scheduler's
loop itself answers every run at once and the engine says it is down."""

from __future__ import annotations

import queue
import threading

import pytest

from inference.errors import EngineDown, InputError
from inference.events import DoneEvent, StepEvent
from inference.request import prepare_run
from inference.sampling.constrain import Matcher
from inference.sampling.params import SamplingParams
from inference.sampling.state import RunState
from inference.serving import scheduler as scheduler_module
from inference.serving import step_stats
from inference.serving.engine import Engine
from inference.serving.stop import StopMatcher

BAD_SEED = 666  # the run a fault is injected into
PROMPTS = ("The quick brown", "Once upon a time", "A B C D")
TIMEOUT_S = 60  # only a broken test waits this long


class Injected(RuntimeError):
    """The fault a test injects."""


@pytest.fixture
def engine(tiny_dirs):
    with Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32") as e:
        e.eos_ids = set()  # every run makes all its tokens
        yield e


def requests(engine, bad: dict | None = None, n_new: int = 6):
    """Three sampled runs and, with `bad`, a fourth (seed BAD_SEED, those settings) between them."""
    good = [prepare_run(engine, SamplingParams(max_new_tokens=n_new, seed=10 + i, temperature=0.9), prompt=p)
            for i, p in enumerate(PROMPTS)]
    if bad is None:
        return good
    faulty = prepare_run(engine, SamplingParams(**{"max_new_tokens": n_new, "seed": BAD_SEED, **bad}),
                         prompt="The quick")
    return good[:1] + [faulty] + good[1:]


def run_together(engine, reqs) -> list:
    """Submit every request at once (admitted in one go: the loop waits for the lock held here),
    then each one's events: its token ids and how it ended (a DoneEvent's reason or the error)."""
    sched = engine.scheduler
    with sched._cv:
        runs = [sched.submit(r.ids, r.params, r.top_n, threading.Event(), r.max_new, r.capped, r.seed, len(r.given))
                for r in reqs]
    out = []
    for run in runs:
        tokens, end = [], None
        while end is None:
            ev = run.events.get(timeout=TIMEOUT_S)
            if isinstance(ev, BaseException):
                end = ev
            elif isinstance(ev, StepEvent):
                tokens.append(ev.token_id)
            elif isinstance(ev, DoneEvent):
                end = ev.reason
        out.append((tokens, end))
    return out


def alone(engine, reqs) -> list:
    return [[ev.token_id for ev in engine.run(r) if isinstance(ev, StepEvent)] for r in reqs]


def check_isolated(engine, outcome, expected_alone, error_type=Injected):
    """The faulty run (the second) ended with its error, the others made their alone tokens, the
    pool is empty again, and a next run completes."""
    (t0, e0), (_, bad_end), *rest = outcome
    assert isinstance(bad_end, error_type), bad_end
    good = [(t0, e0), *rest]
    assert [t for t, _ in good] == expected_alone
    assert all(end == "length" for _, end in good)
    stats = engine.scheduler.stats()
    assert stats.active_runs == 0 and stats.waiting_runs == 0
    assert engine.scheduler.pool.blocks_used == engine.scheduler.prefix_cache.blocks  # only the cache holds blocks
    engine.scheduler.prefix_cache.evict(engine.scheduler.prefix_cache.blocks)
    assert engine.scheduler.pool.blocks_used == 0
    assert alone(engine, requests(engine)[:1]) == expected_alone[:1]  # the engine keeps serving
    assert engine.down is None


def test_a_fault_at_a_runs_start_ends_that_run_alone(engine, monkeypatch):
    expected = alone(engine, requests(engine))
    real = RunState.at.__func__

    def at(cls, params, *args, **kwargs):
        if kwargs.get("seed", args[3] if len(args) > 3 else None) == BAD_SEED:
            raise Injected("its state cannot be built")
        return real(cls, params, *args, **kwargs)
    monkeypatch.setattr(RunState, "at", classmethod(at))
    check_isolated(engine, run_together(engine, requests(engine, {"temperature": 0.9})), expected)


def test_a_fault_in_a_sampler_stage_ends_that_run_alone(engine, monkeypatch):
    """The stage raises inside the batch's sampling: the others are sampled again from the same
    generator states, so their draws are those of their runs alone."""
    expected = alone(engine, requests(engine))
    def failing(real):  # the stages with and without the candidates' removals followed
        def stages(logits, params, state, *ids):
            if params.seed == BAD_SEED and state.step == 2:
                raise Injected("a stage failed")
            return real(logits, params, state, *ids)
        return stages
    for name in ("final_candidates",):
        monkeypatch.setattr(step_stats, name, failing(getattr(step_stats, name)))
    check_isolated(engine, run_together(engine, requests(engine, {"temperature": 0.9})), expected)


def test_a_fault_in_a_greedy_rows_stage_ends_that_run_alone(engine, monkeypatch):
    expected = alone(engine, requests(engine))
    real = step_stats.greedy_logits

    def greedy_logits(logits, params, state):
        if params.seed == BAD_SEED:
            raise Injected("a greedy stage failed")
        return real(logits, params, state)
    monkeypatch.setattr(step_stats, "greedy_logits", greedy_logits)
    check_isolated(engine, run_together(engine, requests(engine, {"temperature": 0.0, "repetition_penalty": 1.2})),
                   expected)


def test_a_fault_in_the_constraint_matcher_ends_that_run_alone(engine, monkeypatch):
    expected = alone(engine, requests(engine))
    real = Matcher.accept
    calls = {"n": 0}

    def accept(self, token):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Injected("the matcher failed")
        return real(self, token)
    monkeypatch.setattr(Matcher, "accept", accept)
    bad = {"temperature": 0.9, "constraint": "regex", "constraint_text": "[a-z ]+"}
    check_isolated(engine, run_together(engine, requests(engine, bad)), expected)


def test_a_fault_while_detokenizing_ends_that_run_alone(engine, monkeypatch):
    expected = alone(engine, requests(engine))
    real = engine.tokenizer.stream
    made = {"n": 0}

    class Failing:
        def __init__(self, decoder):
            self.decoder, self.pushed = decoder, 0

        def push(self, token):
            self.pushed += 1
            if self.pushed == 3:
                raise Injected("the tokenizer failed")
            return self.decoder.push(token)

        def __getattr__(self, name):
            return getattr(self.decoder, name)

    def stream():
        made["n"] += 1
        return Failing(real()) if made["n"] == 2 else real()  # the second run admitted: the faulty one
    monkeypatch.setattr(engine.tokenizer, "stream", stream)
    check_isolated(engine, run_together(engine, requests(engine, {"temperature": 0.9})), expected)


def test_a_fault_in_a_stop_string_ends_that_run_alone(engine, monkeypatch):
    expected = alone(engine, requests(engine))
    real = StopMatcher.push

    def push(self, delta):
        if "zzz" in self.stops:
            raise Injected("the stop strings failed")
        return real(self, delta)
    monkeypatch.setattr(StopMatcher, "push", push)
    bad_req = requests(engine, {"temperature": 0.9})
    from dataclasses import replace
    bad_req[1] = replace(bad_req[1], params=replace(bad_req[1].params, stop=("zzz",)))
    check_isolated(engine, run_together(engine, bad_req), expected)


def test_a_fault_at_a_runs_end_ends_that_run_alone(engine, monkeypatch):
    expected = alone(engine, requests(engine))
    from inference.serving import run_events
    real = run_events.done_event

    def done(run, reason):
        if run.seed == BAD_SEED:
            raise Injected("its end failed")
        return real(run, reason)
    monkeypatch.setattr(run_events, "done_event", done)
    check_isolated(engine, run_together(engine, requests(engine, {"temperature": 0.9})), expected)


def test_a_run_the_pool_cannot_grow_ends_alone(engine, monkeypatch):
    expected = alone(engine, requests(engine))
    real = scheduler_module.BlockTable.grow_to
    tables = {}

    def grow_to(self, positions):
        if tables.get(id(self)) and positions > 4:
            raise Injected("no block for it")
        return real(self, positions)
    monkeypatch.setattr(scheduler_module.BlockTable, "grow_to", grow_to)
    real_start = scheduler_module.Scheduler._start

    def start(self, run, prefix):
        real_start(self, run, prefix)
        tables[id(run.table)] = run.seed == BAD_SEED
    monkeypatch.setattr(scheduler_module.Scheduler, "_start", start)
    check_isolated(engine, run_together(engine, requests(engine, {"temperature": 0.9})), expected)


def test_a_branch_the_constraint_forbids_is_refused_before_it_is_queued(engine):
    """The reproduction: a branch's given tokens that the JSON schema does not allow. Refused on
    the caller's thread in one line; nothing reaches the scheduler, which serves the next run."""
    tok = engine.tokenizer
    given = tok.encode_continuation(", and")
    params = SamplingParams(max_new_tokens=4, temperature=0, constraint="json_schema",
                            constraint_text='{"type": "object"}')
    with pytest.raises(InputError, match="does not allow the given tokens: token 0") as e:
        prepare_run(engine, params, prompt="The capital of France is", given=given)
    assert e.value.field == "constraint_text" and "\n" not in str(e.value)
    with pytest.raises(InputError, match="does not allow the given tokens"):
        list(engine.generate_ids(engine.prompt_ids("The capital"), params, given=given))
    assert engine.active_runs == 0
    assert len(alone(engine, requests(engine)[:1])[0]) == 6


def test_a_fault_of_the_loop_itself_answers_every_run_and_the_engine_says_it_is_down(engine, monkeypatch):
    """The loop dies (a fault outside any one run): every run waiting or admitted gets the error
    at once, nobody hangs, later runs are refused with it, and the engine says it is down."""
    real = scheduler_module.Scheduler._iteration
    calls = {"n": 0}

    def iteration(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Injected("the loop's own fault")
        return real(self)
    monkeypatch.setattr(scheduler_module.Scheduler, "_iteration", iteration)
    reqs = requests(engine, n_new=50)
    outcome = run_together(engine, reqs)
    assert all(isinstance(end, EngineDown) for _, end in outcome), outcome
    assert "Injected: the loop's own fault" in str(outcome[0][1]) and "\n" not in str(outcome[0][1])
    assert isinstance(engine.down, EngineDown)
    assert engine.scheduler.pool.blocks_used == 0
    with pytest.raises(EngineDown):
        list(engine.run(reqs[0]))
    got: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: got.put(engine.close()), daemon=True).start()
    assert got.get(timeout=TIMEOUT_S) is None  # closing a dead engine does not hang
