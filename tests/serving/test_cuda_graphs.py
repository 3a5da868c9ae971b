"""CUDA graphs replaying the fixed-shape decode step (static_step.py), on a CUDA device only
(bench/gpu_check.sh runs this file there): the replayed step gives the eager step's tokens."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from inference.events import StepEvent
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine
from inference.serving.static_step import StaticDecode

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the capture is checked there")


def generate(engine, n):
    prompts = ["The quick brown fox", "Once upon a time", "def fibonacci(n):"][:n]
    go, step = threading.Event(), engine.scheduler._step

    def held(active):
        go.wait(60)
        return step(active)
    engine.scheduler._step = held

    def one(p):
        ids = engine.tokenizer.encode(p)
        return [e for e in engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=40), top_n=5)
                if isinstance(e, StepEvent)]
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, p) for p in prompts]
        while engine.active_runs < n:
            threading.Event().wait(0.001)
        go.set()
        out = [f.result() for f in futures]
    engine.scheduler._step = step
    return out


@pytest.mark.parametrize("n", [1, 3])
def test_replayed_graphs_give_the_eager_tokens(tiny_dirs, n):
    with Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cuda", dtype="float32") as engine:
        eager = generate(engine, n)
        engine.scheduler.prefix_cache.evict(engine.scheduler.pool.n_blocks)
        engine.scheduler.static = static = StaticDecode(engine.model, engine.scheduler.pool, capture=True)
        replayed = generate(engine, n)
        assert static.graphs  # captured, then replayed
    for a, b in zip(eager, replayed):
        assert [e.token_id for e in a] == [e.token_id for e in b]
        assert max(abs(x.raw_prob - y.raw_prob) for x, y in zip(a, b)) < 1e-4
