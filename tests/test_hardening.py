"""A shared demo gets every kind of input and many users at once: it keeps serving, loses nothing."""

import gc
import resource
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from inference.engine import Engine, Request
from inference.errors import ResourceError
from inference.sampling import SamplingParams
from ui.controls import Controls
from ui.handlers import Handlers


@pytest.mark.parametrize("prompt", ["tab\there\x00nul\x1bescape\x7f", "שלום עולם مرحبا بالعالم",
                                    "emoji 👩‍👩‍👧‍👦🏳️‍🌈 and 中文", "\u202eRTL override\u202c", "\r\nline\r\n"])
def test_unusual_prompts_generate_and_stream_cleanly(tiny_engine, prompt):
    events = list(tiny_engine.generate(Request(prompt, SamplingParams(max_new_tokens=8, seed=1))))
    done = events[-1]
    assert done.generated_tokens >= 1 and done.text == "".join(e.text for e in events[:-1]) + done.tail


def test_failing_chat_template_is_a_clear_page_error(tiny_dirs, tmp_path):
    import json
    import shutil
    d = tmp_path / "badchat"
    shutil.copytree(tiny_dirs["mha"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages[0]['content'] | no_such_filter }}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    h = Handlers(Engine.from_hf_dir(d))
    c = Controls(prompt="hi", mode="chat")
    with pytest.raises(gr.Error, match="chat template failed"):
        list(h.generate(*c.values(), None))


def test_out_of_memory_ends_the_run_with_a_message_and_keeps_serving(tiny_engine, monkeypatch):
    forward = tiny_engine.model.forward
    calls = {"n": 0}

    def oom_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_engine.model, "forward", oom_on_third)
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # no early end before the third forward
    h = Handlers(tiny_engine)
    with pytest.raises(gr.Error, match="out of CPU memory after 2 tokens"):
        list(h.generate(*Controls(prompt="The quick", max_new_tokens=10).values(), None))
    assert tiny_engine.active_runs == 0
    with pytest.raises(ResourceError):
        calls["n"] = 0
        list(tiny_engine.generate(Request("The quick", SamplingParams(max_new_tokens=10))))
    monkeypatch.setattr(tiny_engine.model, "forward", forward)
    assert list(tiny_engine.generate(Request("The quick", SamplingParams(max_new_tokens=3))))[-1].generated_tokens == 3


def test_closing_the_stream_mid_run_cancels_the_engine_thread(tiny_engine):
    h = Handlers(tiny_engine)
    c = Controls(prompt="The quick", max_new_tokens=240, temperature=1.0, seed="2")
    gen = h.generate(*c.values(), SimpleNamespace(session_hash="tab"))
    next(gen)
    next(gen)
    gen.close()  # what gradio does when the client disconnects
    assert tiny_engine.active_runs == 0 and len(h.registry) == 0
    assert not [t for t in threading.enumerate() if t.name == "tokenlab-run"]


def test_eight_sessions_at_once_each_get_their_own_tokens(tiny_engine):
    h = Handlers(tiny_engine)
    settings = [Controls(prompt=f"Story {i}:", temperature=1.0, top_k=20, max_new_tokens=25, seed=str(100 + i))
                for i in range(8)]

    def run(i):
        return list(h.generate(*settings[i].values(), SimpleNamespace(session_hash=f"user{i}")))[-1][-1]

    alone = [[s.token_id for s in run(i).steps] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = [[s.token_id for s in rec.steps] for rec in pool.map(run, range(8))]
    assert together == alone
    assert len({tuple(t) for t in alone}) == 8  # the sessions really differ
    assert tiny_engine.active_runs == 0


def test_memory_does_not_grow_over_fifty_runs(tiny_engine):
    h = Handlers(tiny_engine)
    c = Controls(prompt="The quick brown fox", temperature=1.0, max_new_tokens=30)

    def runs(n):
        for i in range(n):
            list(h.generate(*c.values(), SimpleNamespace(session_hash=f"s{i % 3}")))
        gc.collect()
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, peak

    runs(10)  # warm-up: allocator pools, caches
    before = runs(5)
    after = runs(50)
    assert after - before < 20 * 1024, f"peak RSS grew by {(after - before) / 1024:.1f} MiB"
