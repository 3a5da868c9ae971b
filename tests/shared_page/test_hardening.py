"""A shared demo gets every kind of input and many users at once: it keeps serving, loses nothing."""

import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from inference.serving.engine import Engine, Request
from inference.errors import ResourceError
from inference.sampling.params import SamplingParams
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
        list(h.run.generate(*c.values(), None))


def test_out_of_memory_ends_the_run_with_a_message_and_keeps_serving(tiny_engine, monkeypatch):
    forward = tiny_engine.model.forward_paged
    calls = {"n": 0}

    def oom_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_engine.model, "forward_paged", oom_on_third)
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # no early end before the third forward
    h = Handlers(tiny_engine)
    with pytest.raises(gr.Error, match="out of CPU memory after 2 tokens"):
        list(h.run.generate(*Controls(prompt="The quick", max_new_tokens=10).values(), None))
    assert tiny_engine.active_runs == 0
    with pytest.raises(ResourceError):
        calls["n"] = 0
        list(tiny_engine.generate(Request("The quick", SamplingParams(max_new_tokens=10))))
    monkeypatch.setattr(tiny_engine.model, "forward_paged", forward)
    assert list(tiny_engine.generate(Request("The quick", SamplingParams(max_new_tokens=3))))[-1].generated_tokens == 3


def test_closing_the_stream_mid_run_cancels_the_engine_thread(tiny_engine, hold):
    held = hold(tiny_engine)
    h = Handlers(tiny_engine, update_interval_s=0.01)
    c = Controls(prompt="The quick", max_new_tokens=240, temperature=1.0, seed="2")
    gen = h.run.generate(*c.values(), SimpleNamespace(session_hash="tab"))
    next(gen)
    held.step(2)  # the run has made 2 tokens and is held before the 3rd
    assert len(next(gen)["record"].steps) >= 1
    gen.close()  # what gradio does when the client disconnects
    assert held.started == 3  # no token after the one being made at the close
    assert tiny_engine.active_runs == 0 and len(h.page.registry) == 0
    assert not [t for t in threading.enumerate() if t.name == "tokenlab-run"]


def test_eight_sessions_at_once_each_get_their_own_tokens(tiny_engine):
    h = Handlers(tiny_engine)
    settings = [Controls(prompt=f"Story {i}:", temperature=1.0, top_k=20, max_new_tokens=25, seed=str(100 + i))
                for i in range(8)]

    def run(i):
        return list(h.run.generate(*settings[i].values(), SimpleNamespace(session_hash=f"user{i}")))[-1]["record"]

    alone = [[s.token_id for s in run(i).steps] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = [[s.token_id for s in rec.steps] for rec in pool.map(run, range(8))]
    assert together == alone
    assert len({tuple(t) for t in alone}) == 8  # the sessions really differ
    assert tiny_engine.active_runs == 0


def test_nothing_outlives_its_run(tiny_engine, hold, monkeypatch):
    """After runs that end, runs stopped mid-run and runs whose page went away mid-run, no
    scheduler run, KV block, engine thread, record or event of a run is left, but the last
    record of each session: the page keeps that one (a gr.State)."""
    runs = weakref.WeakSet()
    submit = tiny_engine.scheduler.submit

    def tracked_submit(*args, **kwargs):
        run = submit(*args, **kwargs)
        runs.add(run)
        return run

    monkeypatch.setattr(tiny_engine.scheduler, "submit", tracked_submit)
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # every run is still going at token 3
    held = hold(tiny_engine)
    h = Handlers(tiny_engine, update_interval_s=0.01)
    c = Controls(prompt="The quick brown fox", temperature=1.0, max_new_tokens=30)

    def run(kind, session):
        gen = h.run.generate(*c.values(), SimpleNamespace(session_hash=session))
        if kind == "end":
            held.open()
            rec = list(gen)[-1]["record"]
            held.close()
            return rec
        next(gen)
        held.step(3)  # mid-run
        if kind == "stop":
            h.run.stop(SimpleNamespace(session_hash=session))
            return list(gen)[-1]["record"]
        rec = next(gen)["record"]  # the page has part of the run, then goes away
        gen.close()
        return rec

    page, earlier = {}, []  # the record each session's page shows; weak references to the rest
    for i in range(70):  # 50 runs that end, 10 stopped, 10 disconnected, over 3 sessions
        session = f"s{i % 3}"
        if session in page:
            old = page.pop(session)
            earlier += [weakref.ref(o) for o in (old, *old.steps, old.done) if o is not None]
        page[session] = run((("end",) * 5 + ("stop", "disconnect"))[i % 7], session)
    del old
    gc.collect()
    assert len(runs) == 0, f"{len(runs)} scheduler runs (with their KV block tables) outlived their runs"
    pool = tiny_engine.scheduler.stats()
    assert pool.blocks_used == 0 and pool.blocks_reserved == 0, pool
    alive = [type(r()).__name__ for r in earlier if r() is not None]
    assert not alive, f"{len(alive)} earlier records and events are still alive: {sorted(set(alive))}"
    assert not [t for t in threading.enumerate() if t.name == "tokenlab-run"]
    assert tiny_engine.active_runs == 0 and len(h.page.registry) == 0
    assert [len(rec.steps) > 0 for rec in page.values()] == [True] * 3
