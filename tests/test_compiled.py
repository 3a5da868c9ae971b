"""The static decode step (for CUDA graphs and torch.compile) against the ordinary one."""

import shutil

import pytest
import torch

from inference.compiled import capacity_bucket
from inference.engine import Engine
from inference.sampling import SamplingParams


@pytest.mark.parametrize("name", ["mha", "gqa_tied", "llama3_rope", "linear_headdim"])
def test_decode_static_matches_the_ordinary_decode_step(tiny_dirs, name):
    model = Engine.from_hf_dir(tiny_dirs[name], "cpu", "float32").model
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 30), generator=g)
    n0 = 9
    with torch.inference_mode():
        ref, static = model.new_cache(40), model.new_cache(64)
        static.k.fill_(1e4)  # stale keys and values past the position must be masked out
        static.v.fill_(-1e4)
        model(ids[:, :n0], ref, 0)
        model(ids[:, :n0], static, 0)
        for pos in range(n0, ids.shape[1]):
            a = model(ids[:, pos:pos + 1], ref, pos)
            b = model.decode_static(ids[:, pos:pos + 1], torch.tensor([pos]), static.k, static.v)
            assert (a - b).abs().max().item() < 1e-4, pos
        n = ids.shape[1]  # both caches hold the same keys at the same positions
        assert torch.allclose(ref.k[:, :, :, :n], static.k[:, :, :, :n], atol=1e-5)


def test_capacity_buckets_are_few():
    assert [capacity_bucket(n, 8192) for n in (1, 256, 257, 1000, 5000, 9000)] == \
        [256, 256, 512, 1024, 8192, 8192]
    assert capacity_bucket(300, 300) == 300


def run(engine, seed=None, temperature=0.0, n=20, prompt=(1, 5, 9, 20)):
    params = SamplingParams(temperature=temperature, top_k=20, max_new_tokens=n, seed=seed)
    events = list(engine.generate_ids(list(prompt), params))
    return [e.token_id for e in events[:-1]], [e.prob for e in events[:-1]], events[-1]


def test_compiled_engine_generates_what_the_eager_one_does(tiny_dirs, monkeypatch):
    """Traced by dynamo in one graph (fullgraph) and run: same tokens and probabilities as the
    eager engine; the cache is reused by the next run, which compiles nothing new."""
    from torch._dynamo.utils import counters

    eager = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32")
    compiled = Engine(eager.model, eager.tokenizer, compile_backend="eager")
    steps = []
    step = compiled.decoder.step
    monkeypatch.setattr(compiled.decoder, "step", lambda token, cache: steps.append(cache.length) or step(token, cache))
    for kw in (dict(), dict(seed=3, temperature=0.9), dict(n=40, prompt=(2, 3, 4, 5, 6, 7))):
        counters.clear()
        ids, probs, done = run(compiled, **kw)
        ref_ids, ref_probs, _ = run(eager, **kw)
        assert ids == ref_ids
        assert max(abs(a - b) for a, b in zip(probs, ref_probs)) < 1e-5
        assert compiled.decoder.held_bytes > 0 and compiled.active_runs == 0
        if kw:  # the first run compiled; the same cache capacity again compiles nothing
            assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])
    assert len(steps) == 19 + 19 + 39  # every decode step went through the compiled step


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor needs a C++ compiler on the CPU")
def test_compiled_with_inductor_on_the_cpu(tiny_dirs):
    """The flag's real path: inductor generates and compiles C++ for the tiny model (~15 s)."""
    eager = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32")
    compiled = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32", compile=True)
    ids, probs, _ = run(compiled, seed=5, temperature=0.8)
    ref_ids, ref_probs, _ = run(eager, seed=5, temperature=0.8)
    assert ids == ref_ids
    assert max(abs(a - b) for a, b in zip(probs, ref_probs)) < 1e-4
