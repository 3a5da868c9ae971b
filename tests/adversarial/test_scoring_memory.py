"""Issue 59, finding 8: one request could take the memory. An echo with logprobs of a 7,580-token
prompt raised resident memory by 549 MiB at its peak: the whole prompt went through the model at
once. Scoring now reads the prompt PROMPT_ROWS positions at a time into one cache, so what it
holds besides the prompt's keys and values does not grow with the prompt (measured here as the
peak bytes of live tensors, not time); and a shared page scores at most --max-score-tokens,
saying so when it refuses."""

from __future__ import annotations

import random
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from inference.serving.scoring import PROMPT_ROWS
from server.limits import Limits


class LiveTensorBytes(TorchDispatchMode):
    """The bytes of the CPU tensors that torch's operators made while it is on, and their peak:
    each storage counted once, for as long as a tensor made on it lives."""

    def __init__(self):
        super().__init__()
        self.refs, self.sizes, self.now, self.peak = {}, {}, 0, 0

    def _gone(self, key):
        self.refs[key] -= 1
        if not self.refs[key]:
            self.now -= self.sizes.pop(key)
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if not key:
                    continue
                if key not in self.refs:
                    self.refs[key], self.sizes[key] = 0, storage.nbytes()
                    self.now += storage.nbytes()
                    self.peak = max(self.peak, self.now)
                self.refs[key] += 1
                weakref.finalize(t, self._gone, key)
        return out


@pytest.fixture(scope="module")
def long_context_engine(tmp_path_factory, sp_model_bytes):
    """A tiny model with a 4,096-token context whose MLP is wide (2,048): a prompt read whole
    holds its activations, read in chunks one chunk's."""
    from inference.serving.engine import Engine
    from tiny_models import make_tiny_model
    d = make_tiny_model(tmp_path_factory.mktemp("long"), "gqa_tied", seed=3, sp_model=sp_model_bytes,
                        max_position_embeddings=4096, intermediate_size=2048)
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as engine:
        yield engine


def held_beyond_the_cache(engine, n: int) -> int:
    """Peak bytes of live tensors while scoring an n-token prompt, less its keys and values."""
    ids = [random.Random(n).randrange(4, engine.vocab_size) for _ in range(n)]
    with LiveTensorBytes() as live:
        scored = engine.prompt_logprobs(ids, top_n=5)
    assert len(scored) == n - 1 and live.now == 0  # every position scored, nothing left behind
    return live.peak - n * engine.cfg.kv_bytes_per_token(4)


def test_scoring_holds_one_chunk_whatever_the_prompts_length(long_context_engine):
    engine = long_context_engine
    short, long = 500, 3_000
    grew = held_beyond_the_cache(engine, long) - held_beyond_the_cache(engine, short)
    # What may grow with the prompt: one chunk's attention scores (float32, each head) and mask
    # (bool) over every key position. Read whole, the activations of every position: 65 MB more here.
    bound = (long - short) * PROMPT_ROWS * (engine.cfg.n_heads * 4 + 1)
    assert grew <= bound, (grew, bound)


def test_a_shared_page_bounds_what_it_scores_and_says_so(tiny_engine):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from api.routes import API
    from server.registry import RunRegistry
    from ui.handlers import Handlers

    limits = Limits(max_score_tokens=16)
    app = FastAPI()
    API(tiny_engine, RunRegistry(), limits).mount(app)
    long_prompt = "the quick brown fox jumps over the lazy dog " * 4
    with TestClient(app) as http:
        r = http.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 1, "echo": True, "logprobs": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert r.json()["error"]["message"].startswith("The server scores texts of at most 16 tokens")
        r = http.post("/v1/completions", json={"prompt": "the quick", "max_tokens": 1, "echo": True, "logprobs": 1})
        assert r.status_code == 200
    h = Handlers(tiny_engine, limits=limits)
    said = h.text_score.score_text_shown(long_prompt, "", None)
    assert "The server scores texts of at most 16 tokens" in said["score_md"]
    assert said["score_data"] is None  # nothing scored
    assert Limits.shared().max_score_tokens == 2048 and Limits.shared(max_score_tokens=0).max_score_tokens is None
