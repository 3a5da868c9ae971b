"""The scheduler: every active run in one forward pass per step, over one paged KV pool. A run's
tokens and probabilities do not depend on who else is running; blocks come back at the end."""

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from inference.serving.engine import Engine
from inference.errors import ResourceError
from inference.events import DoneEvent, PrefillEvent, StepEvent, WaitEvent
from inference.serving.kv_pool import BLOCK_SIZE
from inference.serving.run import fair_shares
from inference.sampling.params import SamplingParams
from ui.controls import Controls
from ui.handlers import Handlers

SETTINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=0.7, top_k=20, seed=2),
            dict(temperature=1.3, top_p=0.9, seed=3), dict(temperature=0.9, min_p=0.05, seed=4),
            dict(temperature=1.0, repetition_penalty=1.3, seed=5), dict(temperature=0.0, stop=("e",)),
            dict(temperature=1.1, seed=6)]
PROMPTS = ["The quick brown fox", "Once upon a time", "今天天气真好", "def fibonacci(n):",
           "Paris is the capital", "Numbers 0123", "Emoji are fun 😀", "The lazy dog"]


def collect(engine, i, cancel=None):
    ids = engine.tokenizer.encode(PROMPTS[i])
    params = SamplingParams(**SETTINGS[i], max_new_tokens=24)
    return list(engine.generate_ids(ids, params, top_n=5, cancel=cancel))


def gate(monkeypatch, engine) -> threading.Event:
    """Hold the scheduler before its next forward pass until the returned event is set."""
    go, step = threading.Event(), engine.scheduler._step

    def held(active):
        assert go.wait(60), "the test never released the scheduler"
        return step(active)
    monkeypatch.setattr(engine.scheduler, "_step", held)
    return go


def test_eight_runs_together_give_each_its_alone_result(tiny_engine, monkeypatch):
    alone = [collect(tiny_engine, i) for i in range(8)]
    go = gate(monkeypatch, tiny_engine)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(collect, tiny_engine, i) for i in range(8)]
        try:
            while tiny_engine.active_runs < 8:  # every run submitted before the first pass
                threading.Event().wait(0.001)
        finally:
            go.set()
        together = [f.result() for f in futures]
    steps = [e for run in together for e in run if isinstance(e, StepEvent)]
    assert max(e.pool.active_runs for e in steps) == 8  # they really shared forward passes
    for a, b in zip(alone, together):
        assert [e.token_id for e in a[:-1]] == [e.token_id for e in b[:-1]]
        assert a[-1].text == b[-1].text and a[-1].reason == b[-1].reason
        for x, y in zip(a[:-1], b[:-1]):
            assert abs(x.prob - y.prob) < 1e-5 and abs(x.raw_prob - y.raw_prob) < 1e-5
            assert [c.id for c in x.top] == [c.id for c in y.top]
    stats = tiny_engine.scheduler.stats()
    assert tiny_engine.active_runs == 0 and stats.blocks_used == 0 and stats.blocks_reserved == 0


def test_a_lone_run_on_scattered_blocks_equals_one_on_consecutive_blocks(tiny_dirs, monkeypatch):
    """A lone run reads consecutive blocks in place, scattered ones gathered a block at a time
    with the tail of its last block masked: the same tokens and probabilities."""
    tiny_engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32")  # a pool no run has used
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=40)
    ids = tiny_engine.tokenizer.encode(PROMPTS[0])
    from inference.serving import step_batch
    scheduler, read_in_place = tiny_engine.scheduler, []
    context = step_batch.decode_context

    def spy(decode, dev):
        ctx, mask = context(decode, dev)
        read_in_place.append(isinstance(ctx, slice))
        return ctx, mask
    monkeypatch.setattr(step_batch, "decode_context", spy)
    consecutive = list(tiny_engine.generate_ids(ids, params, top_n=5))
    assert read_in_place and all(read_in_place)
    pool, read_in_place[:] = scheduler.pool, []
    scheduler.prefix_cache.evict(pool.n_blocks)  # the first run's kept blocks: back to the pool
    taken = [pool.take() for _ in range(8)]
    pool.give_back(taken[::2])  # free blocks with holes between them
    try:
        scattered = list(tiny_engine.generate_ids(ids, params, top_n=5))
    finally:
        pool.give_back(taken[1::2])
    assert read_in_place and not any(read_in_place)  # really gathered, masked
    assert [e.token_id for e in consecutive[:-1]] == [e.token_id for e in scattered[:-1]]
    assert max(abs(x.prob - y.prob) + abs(x.raw_prob - y.raw_prob)
               for x, y in zip(consecutive[:-1], scattered[:-1])) < 1e-6


def test_a_long_prompt_prefilled_in_chunks_equals_one_pass(tiny_dirs):
    whole = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32", prefill_chunk=1024)
    chunked = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32", prefill_chunk=7)
    ids = whole.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    assert len(ids) > 3 * 7
    params = SamplingParams(temperature=1.0, seed=9, max_new_tokens=10)
    a = list(whole.generate_ids(ids, params, top_n=5))
    events = list(chunked.generate_ids(ids, params, top_n=5))
    progress = [e.done for e in events if isinstance(e, PrefillEvent)]  # said after each chunk but the last
    assert progress == list(range(7, len(ids), 7)) and isinstance(events[len(progress)], StepEvent)
    assert not any(isinstance(e, PrefillEvent) for e in a)  # one chunk: nothing to say
    b = events[len(progress):]
    assert [e.token_id for e in a[:-1]] == [e.token_id for e in b[:-1]]
    assert max(abs(x.raw_prob - y.raw_prob) for x, y in zip(a[:-1], b[:-1])) < 1e-5


def test_the_prefill_budget_is_shared_evenly_and_leftovers_go_on():
    assert fair_shares({"long": 6000, "short": 4}, 128) == {"short": 4, "long": 124}
    assert fair_shares({"a": 100, "b": 100, "c": 100}, 128) == {"a": 42, "b": 43, "c": 43}
    assert fair_shares({"a": 50, "b": 10, "c": 90}, 64) == {"b": 10, "a": 27, "c": 27}
    assert fair_shares({k: 5 for k in "abcde"}, 3) == {"a": 1, "b": 1, "c": 1, "d": 0, "e": 0}
    assert fair_shares({}, 128) == {}


def test_a_short_prompt_is_read_beside_a_long_one_not_after_it(tiny_dirs, monkeypatch):
    """A short prompt submitted with a long one in prefill gets its first token at once (the long
    one took the whole budget for all its chunks before), and both give their alone tokens."""
    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32", prefill_chunk=32)
    long_ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)
    short_ids = engine.tokenizer.encode("Once upon")
    assert len(long_ids) > 4 * 32 and len(short_ids) <= 32 // 2  # the long one: 5 passes or more
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=6)
    other = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32", prefill_chunk=32)  # (its cache, not this one's)
    alone = [list(other.generate_ids(ids, params, top_n=5)) for ids in (long_ids, short_ids)]
    passes, first = [], {}  # forward passes so far; each prompt's length -> the pass of its first token
    step, emit = engine.scheduler._step, engine.scheduler._emit

    def counted(active):
        passes.append(len(active))
        return step(active)

    def noted(run, info):
        first.setdefault(run.n_prompt, len(passes))
        return emit(run, info)
    monkeypatch.setattr(engine.scheduler, "_step", counted)
    monkeypatch.setattr(engine.scheduler, "_emit", noted)
    go = gate(monkeypatch, engine)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(lambda ids: list(engine.generate_ids(ids, params, top_n=5)), ids)
                   for ids in (long_ids, short_ids)]
        try:
            while engine.active_runs < 2:  # both submitted before the first pass
                threading.Event().wait(0.001)
        finally:
            go.set()
        together = [f.result() for f in futures]
    # The first pass may hold the long run alone (the scheduler took the active runs, then waited):
    # the short one reads its prompt in the second at the latest (after the long one's 7th before).
    assert first[len(short_ids)] <= 2 < -(-len(long_ids) // 32) <= first[len(long_ids)]
    for a, b in zip(alone, together):
        steps_a, steps_b = ([e for e in run if isinstance(e, StepEvent)] for run in (a, b))
        assert [e.token_id for e in steps_a] == [e.token_id for e in steps_b]
        assert max(abs(x.raw_prob - y.raw_prob) for x, y in zip(steps_a, steps_b)) < 1e-5


def test_blocks_grow_with_the_run_and_come_back(tiny_engine):
    events = collect(tiny_engine, 0)
    n_prompt = len(tiny_engine.tokenizer.encode(PROMPTS[0]))
    for e in events[:-1]:
        held = n_prompt + e.step  # positions in the cache at this step
        assert e.kv_blocks == -(-held // BLOCK_SIZE) and e.pool.blocks_used >= e.kv_blocks
    assert tiny_engine.scheduler.stats().blocks_used == 0


def test_a_run_that_can_never_fit_is_refused(tiny_dirs):
    engine = Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32", kv_pool_mib=0.01)
    blocks = engine.scheduler.pool.n_blocks
    ids = engine.tokenizer.encode("The quick brown fox")
    with pytest.raises(ResourceError, match=f"needs .* KV blocks .* pool has {blocks}") as e:
        list(engine.generate_ids(ids, SamplingParams(max_new_tokens=200)))
    assert "\n" not in str(e.value) and engine.active_runs == 0


def test_when_the_pool_is_full_a_run_waits_then_runs(tiny_dirs, monkeypatch):
    engine = Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32")
    per_block = engine.scheduler.pool.bytes_per_block
    ids = engine.tokenizer.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, seed=4, max_new_tokens=3 * BLOCK_SIZE)
    alone = list(engine.generate_ids(ids, params))
    need = -(-(len(ids) + params.max_new_tokens) // BLOCK_SIZE)
    engine = Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32", kv_pool_mib=(need + 1) * per_block / 2**20)
    go = gate(monkeypatch, engine)
    first = engine.generate_ids(ids, params)
    second = engine.generate_ids(ids, params)
    with ThreadPoolExecutor(1) as pool:
        a = pool.submit(list, first)
        try:
            while engine.scheduler.stats().active_runs < 1:  # admitted, held before its first pass
                threading.Event().wait(0.001)
            waiting = next(second)  # the pool holds one such run: the second waits
        finally:
            go.set()
        assert isinstance(waiting, WaitEvent) and waiting.position == 1 and waiting.blocks_needed == need
        b = [waiting] + list(second)
        a = a.result()
    assert not any(isinstance(e, WaitEvent) for e in a)
    assert [e.token_id for e in a[:-1]] == [e.token_id for e in alone[:-1]] == [e.token_id for e in b[1:-1]]
    assert b[1].wait_ms > 0 and engine.scheduler.stats().blocks_used == 0


def test_closing_or_cancelling_gives_the_blocks_back(tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # a random seed: no end-of-sequence before the cancel
    go = gate(monkeypatch, tiny_engine)
    go.set()
    gen = tiny_engine.generate_ids(tiny_engine.tokenizer.encode("The quick"), SamplingParams(max_new_tokens=100))
    next(gen)
    gen.close()  # a closed stream: returns once the run's blocks are back
    assert tiny_engine.active_runs == 0 and tiny_engine.scheduler.stats().blocks_used == 0
    go.clear()
    cancel = threading.Event()
    gen = tiny_engine.generate_ids(tiny_engine.tokenizer.encode("The quick"), SamplingParams(max_new_tokens=100),
                                   cancel=cancel)
    with ThreadPoolExecutor(1) as pool:
        rest = pool.submit(list, gen)
        try:
            while tiny_engine.active_runs < 1:
                threading.Event().wait(0.001)
            cancel.set()  # while the scheduler is held before the run's first pass
        finally:
            go.set()
        events = rest.result()
    assert isinstance(events[-1], DoneEvent) and events[-1].reason == "cancelled" and len(events) <= 2
    assert tiny_engine.active_runs == 0 and tiny_engine.scheduler.stats().blocks_used == 0


def test_churn_of_32_clients_leaves_nothing_behind(tiny_engine):
    """32 page sessions run, stop and disconnect at random (a fixed seed, three actions each):
    no exception, every completed run gives its alone text, and the pool ends empty."""
    h = Handlers(tiny_engine, top_n=3, update_interval_s=0.01)
    settings = [Controls(prompt=PROMPTS[i % 8], temperature=1.0, top_k=30, max_new_tokens=20, seed=str(i))
                for i in range(8)]
    alone = [list(h.run.generate(*c.values(), SimpleNamespace(session_hash="alone")))[-1]["record"].done.text
             for c in settings]
    rng = random.Random(0)
    plans = [[(rng.randrange(8), rng.choice(["run", "stop", "disconnect"])) for _ in range(3)] for _ in range(32)]

    def client(k):
        session = SimpleNamespace(session_hash=f"churn{k}")
        texts = []
        for which, action in plans[k]:
            gen = h.run.generate(*settings[which].values(), session)
            if action == "run":
                texts.append((which, list(gen)[-1]["record"].done.text))
            elif action == "stop":
                next(gen)
                h.run.stop(session)
                list(gen)
            else:
                next(gen)
                gen.close()
        return texts

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(client, range(32)))
    completed = [t for r in results for t in r]
    assert completed and all(text == alone[which] for which, text in completed)
    stats = tiny_engine.scheduler.stats()
    assert tiny_engine.active_runs == 0 and stats.blocks_used == 0 and stats.blocks_reserved == 0
    assert len(h.page.registry) == 0


def test_a_follow_up_reads_only_what_is_new_from_the_kv_cache(tiny_dirs):
    """A finished run's whole blocks are kept; a prompt that repeats its tokens (a chat's next
    turn) starts from them, with the same tokens and probabilities as a fresh computation."""
    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32")
    fresh = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32")
    first = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 5)
    params = SamplingParams(temperature=1.0, seed=8, max_new_tokens=20)
    a = [e for e in engine.generate_ids(first, params, top_n=5) if isinstance(e, StepEvent)]
    generated = [e.token_id for e in a]
    held = len(first) + len(generated) - 1  # the last token sampled is never fed back
    assert a[0].prompt_tokens_reused == 0
    assert engine.scheduler.stats().blocks_cached == held // BLOCK_SIZE
    follow_up = first + generated + engine.tokenizer.encode(" And then?")
    b = [e for e in engine.generate_ids(follow_up, params, top_n=5) if isinstance(e, StepEvent)]
    assert b[0].prompt_tokens_reused == min(held, len(follow_up) - 1) // BLOCK_SIZE * BLOCK_SIZE > 0
    c = [e for e in fresh.generate_ids(follow_up, params, top_n=5) if isinstance(e, StepEvent)]
    assert [e.token_id for e in b] == [e.token_id for e in c]
    assert max(abs(x.prob - y.prob) + abs(x.raw_prob - y.raw_prob) for x, y in zip(b, c)) < 1e-5
    stats = engine.scheduler.stats()
    assert stats.blocks_used == 0 and stats.blocks_reserved == 0 and stats.blocks_cached > 0


def test_kept_blocks_are_given_back_when_a_run_needs_them(tiny_dirs):
    probe = Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32")
    ids = probe.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    need = -(-(len(ids) + 40) // BLOCK_SIZE)
    engine = Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32",
                                kv_pool_mib=need * probe.scheduler.pool.bytes_per_block / 2**20)
    assert engine.scheduler.pool.n_blocks == need
    list(engine.generate_ids(ids, params))
    assert engine.scheduler.stats().blocks_cached > 0
    other = engine.tokenizer.encode("Once upon a time there was a lazy dog and a quick fox. " * 3)[:len(ids)]
    events = list(engine.generate_ids(other, params))  # needs the whole pool: the kept blocks go back
    assert not any(isinstance(e, WaitEvent) for e in events) and events[-1].generated_tokens > 0
    assert next(e for e in events if isinstance(e, StepEvent)).prompt_tokens_reused == 0


def test_the_prefix_cache_keeps_only_the_latest_runs(tiny_engine):
    """A stream of one-off prompts: the cache keeps PREFIX_ENTRIES runs' blocks and gives the
    older ones back to the pool, rather than keeping every finished run until the pool is full."""
    import torch
    from inference.serving.kv_pool import PREFIX_ENTRIES, KVPool, PrefixCache
    runs = PREFIX_ENTRIES + 10
    pool = KVPool(tiny_engine.cfg, runs, torch.device("cpu"), torch.float32)
    cache = PrefixCache(pool)
    for i in range(runs):  # run i held one whole block of the token i
        cache.keep([i] * BLOCK_SIZE, [pool.take()])
    assert cache.blocks == PREFIX_ENTRIES and pool.blocks_used == PREFIX_ENTRIES
    assert cache.take_prefix([9] * BLOCK_SIZE + [0]) == []  # an early run's: given back
    assert len(cache.take_prefix([runs - 1] * BLOCK_SIZE + [0])) == 1  # the latest's: kept
