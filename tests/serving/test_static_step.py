"""The fixed-shape decode step (static_step.py), the shape CUDA graphs replay, run eagerly on the
CPU: the same tokens and probabilities as the scheduler's eager step, padding that touches no
run's keys, and a step whose shapes and branches no host value decides."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from inference.events import StepEvent
from inference.model import kernels
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine
from inference.serving.static_step import StaticDecode, blocks_bucket, bucket_for

SETTINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=0.7, top_k=20, seed=2),
            dict(temperature=1.3, top_p=0.9, seed=3), dict(temperature=0.0, repetition_penalty=1.3)]
PROMPTS = ["The quick brown fox", "Once upon a time there was a little model", "今天天气真好",
           "def fibonacci(n):", "Paris is the capital"]


def test_buckets():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 9, 33, 64, 65)] == [1, 2, 4, 8, 16, 64, 64, None]
    assert [blocks_bucket(n) for n in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]


def runs_together(engine, n, monkeypatch):
    """n runs (settings and prompts above) submitted before the first step, so they decode together."""
    go, step = threading.Event(), engine.scheduler._step

    def held(active):
        assert go.wait(60), "the test never released the scheduler"
        return step(active)
    monkeypatch.setattr(engine.scheduler, "_step", held)

    def one(i):
        ids = engine.tokenizer.encode(PROMPTS[i])
        return [e for e in engine.generate_ids(ids, SamplingParams(**SETTINGS[i], max_new_tokens=40), top_n=5)
                if isinstance(e, StepEvent)]
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        try:
            while engine.active_runs < n:
                threading.Event().wait(0.001)
        finally:
            go.set()
        out = [f.result() for f in futures]
    monkeypatch.setattr(engine.scheduler, "_step", step)
    return out


@pytest.mark.parametrize("name", ["gqa_tied", "mistral"])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_fixed_shape_steps_equal_the_eager_steps(tiny_dirs, sp_model_bytes, tmp_path, monkeypatch, name, n):
    """1, 3 (padded to 4) and 5 (padded to 8) runs, 40 tokens each (a mistral window of 8 bites,
    block tables grow past one block): tokens identical, probabilities within 1e-5; for a lone run
    the same bits where our CPU kernels serve (several runs' prompts are read together by oneDNN,
    whose float32 sums of one prompt need not be the same bits from one call to the next)."""
    from tiny_families import make_family_model
    directory = tiny_dirs[name] if name in tiny_dirs else make_family_model(tmp_path, name, sp_model_bytes)[0]
    with Engine.from_hf_dir(directory, device="cpu", dtype="float32") as engine:
        eager = runs_together(engine, n, monkeypatch)
        engine.scheduler.prefix_cache.evict(engine.scheduler.pool.n_blocks)  # both read their prompts afresh
        engine.scheduler.static = static = StaticDecode(engine.model, engine.scheduler.pool, capture=False)
        fixed = runs_together(engine, n, monkeypatch)
        assert bucket_for(n) in {rows for rows, _ in static.buffers} and len({nb for _, nb in static.buffers}) >= 2  # tables grew
    tolerance = 0.0 if kernels.available() and n == 1 else 1e-5
    for a, b in zip(eager, fixed):
        assert [e.token_id for e in a] == [e.token_id for e in b] and len(a) > 8
        for x, y in zip(a, b):
            assert abs(x.raw_prob - y.raw_prob) <= tolerance and abs(x.prob - y.prob) <= tolerance
            assert [c.id for c in x.top] == [c.id for c in y.top]


def test_padding_rows_touch_only_the_scratch_block(tiny_engine):
    """Two real rows in a bucket of 2 ... then one row in a bucket of 1 ... and 3 in 4: every slot
    outside the rows' own write slots and the scratch block keeps its bytes."""
    pool, model = tiny_engine.scheduler.pool, tiny_engine.model
    static = StaticDecode(model, pool, capture=False)
    blocks = [pool.take() for _ in range(3)]
    kept_k, kept_v = pool.k.clone(), pool.v.clone()  # the engine's cached prompt prefixes live here too
    try:
        gen = torch.Generator().manual_seed(0)
        pool.k.copy_(torch.randn(pool.k.shape, generator=gen))
        pool.v.copy_(torch.randn(pool.v.shape, generator=gen))
        before_k, before_v = pool.k.clone(), pool.v.clone()
        positions, tables = [5, 20, 33], [[blocks[0]], [blocks[1], blocks[2]], [blocks[2], blocks[0], blocks[1]]]
        slots = [t[p // 16] * 16 + p % 16 for t, p in zip(tables, positions)]
        with torch.inference_mode():
            logits = static([3, 4, 5], positions, slots, tables)
        assert logits.shape == (3, model.cfg.vocab_size) and torch.isfinite(logits).all()
        scratch = slice(pool.scratch_block * 16, (pool.scratch_block + 1) * 16)
        changed = (pool.k != before_k).any(-1).any(-1).any(0)  # (slots,)
        changed[scratch] = False
        assert sorted(changed.nonzero().flatten().tolist()) == sorted(slots)
        assert torch.equal((pool.v != before_v).any(-1).any(-1).any(0).nonzero().flatten()[:3].sort().values,
                           torch.tensor(sorted(slots)))
    finally:
        pool.k.copy_(kept_k)
        pool.v.copy_(kept_v)
        pool.give_back(blocks)


def test_the_fixed_shape_step_reads_no_host_value(tiny_engine, monkeypatch):
    """What the CUDA capture needs, checked on the CPU: with torch's operators (as on CUDA, where
    our CPU kernels do not apply), the step converts no tensor to a host number or truth value."""
    monkeypatch.setattr(kernels, "_library", lambda: None)
    pool, model = tiny_engine.scheduler.pool, tiny_engine.model
    static = StaticDecode(model, pool, capture=False)
    blocks = [pool.take() for _ in range(2)]
    try:
        buf = static._new_buffers(4, 2)
        static._fill(buf, [3, 4], [5, 20], [blocks[0] * 16 + 5, blocks[1] * 16 + 4], [[blocks[0]], blocks])

        def refuse(*args):
            raise AssertionError("a host sync in the fixed-shape step")
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            monkeypatch.setattr(torch.Tensor, name, refuse)
        with torch.inference_mode():
            logits = static._forward(buf)
        monkeypatch.undo()
        assert logits.shape == (4, model.cfg.vocab_size)
    finally:
        pool.give_back(blocks)
