"""Closing the engine, and exit statuses scripts can trust. A daemon thread still
inside torch while the interpreter finalizes aborts the process (exit 134, "terminate called
without an active exception"); the engine's close() ends its thread first. Each outcome here is
held where the test wants it (engine_hold.py, hooked.py), never left to the machine's speed."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import no_early_end
from engine_hold import wait_until
from bench.page_client import free_port
from fake_server import MODELS, FakeServer, chunk
import page_api
from inference.cli import main
from inference.errors import EngineClosed
from inference.events import DoneEvent, StepEvent, WaitEvent
from inference.remote.engine import RemoteEngine
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine
from inference.serving.kv_pool import BLOCK_SIZE

ROOT = Path(__file__).resolve().parents[2]
HOOKED = Path(__file__).resolve().parents[1] / "hooked.py"
EXIT_RUNS = 2  # each is held at the moment of exit: before the fix every one aborted (2 run at once)
ABORT = "terminate called"


def tokenlab_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("tokenlab-") and t.is_alive()}


def cli(hook: str, model: Path, max_new_tokens: int = 3) -> list[str]:
    return [sys.executable, str(HOOKED), hook, "cli", "generate", "--model", str(model),
            "--prompt", "The quick", "--temperature", "0", "--max-new-tokens", str(max_new_tokens), "--jsonl"]


# ------------------------------------------------------------------ the engine's close


def test_close_while_a_run_streams_ends_it_and_the_queued_one_as_cancelled(tiny_dirs, hold):
    """One run admitted and held mid-way, one queued behind it for KV blocks: close() ends both
    as "cancelled", joins the scheduler's thread and leaves the pool empty."""
    before = tokenlab_threads()
    probe = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32")
    ids = probe.tokenizer.encode("The quick")
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=3 * BLOCK_SIZE)
    need = -(-(len(ids) + params.max_new_tokens) // BLOCK_SIZE)
    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], "cpu", "float32",
                                kv_pool_mib=(need + 1) * probe.scheduler.pool.bytes_per_block / 2**20)
    no_early_end(engine)
    held = hold(engine)
    first = engine.generate_ids(ids, params, cancel=threading.Event())
    second = engine.generate_ids(ids, params, cancel=threading.Event())
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(list, first)
        held.step(2)  # two tokens made, held before the third
        waiting = next(second)
        assert isinstance(waiting, WaitEvent)  # the pool holds one such run: the second waits
        b = pool.submit(list, second)
        thread = engine.scheduler._thread
        engine.close()
        assert not thread.is_alive()  # joined before close() returned
        a, b = a.result(), b.result()
    assert isinstance(a[-1], DoneEvent) and a[-1].reason == "cancelled"
    assert 2 <= a[-1].generated_tokens < params.max_new_tokens
    assert isinstance(b[-1], DoneEvent) and b[-1].reason == "cancelled"
    assert b[-1].generated_tokens == 0 and not any(isinstance(e, StepEvent) for e in b)
    stats = engine.scheduler.stats()
    assert stats.blocks_used == stats.blocks_reserved == stats.blocks_cached == 0 and engine.active_runs == 0
    assert tokenlab_threads() <= before


def test_a_closed_engine_refuses_new_work(tiny_dirs):
    engine = Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32")
    ids = engine.tokenizer.encode("The quick")
    assert list(engine.generate_ids(ids, SamplingParams(max_new_tokens=2)))[-1].generated_tokens > 0
    engine.close()
    engine.close()  # again: nothing happens
    assert engine.closed
    with pytest.raises(EngineClosed, match="closed"):
        list(engine.generate_ids(ids, SamplingParams(max_new_tokens=2)))
    for call in (lambda: engine.score(ids, " fox"), lambda: engine.step_logits(ids),
                 lambda: engine.capture(ids, 0)):
        with pytest.raises(EngineClosed):
            call()


def test_a_with_block_closes_the_engine_and_its_thread(tiny_dirs):
    before = tokenlab_threads()
    with Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32") as engine:
        events = list(engine.generate_ids(engine.tokenizer.encode("The quick"), SamplingParams(max_new_tokens=2)))
        thread = engine.scheduler._thread
        assert thread in tokenlab_threads()
    assert isinstance(events[-1], DoneEvent) and engine.closed and not thread.is_alive()
    assert tokenlab_threads() <= before


def test_close_waits_for_a_forward_pass_on_another_thread(tiny_dirs, monkeypatch):
    """A page's score or capture runs on the caller's thread: close() returns after it ends."""
    engine = Engine.from_hf_dir(tiny_dirs["mha"], "cpu", "float32")
    inside, go, order = threading.Event(), threading.Event(), []
    forward = engine.model.forward

    def held_forward(*args, **kwargs):
        inside.set()
        assert go.wait(60), "the test never released the forward pass"
        try:
            return forward(*args, **kwargs)
        finally:
            order.append("forward ended")

    monkeypatch.setattr(engine.model, "forward", held_forward)
    with ThreadPoolExecutor(2) as pool:
        logits = pool.submit(engine.step_logits, engine.tokenizer.encode("The quick"))
        assert inside.wait(60)
        closing = pool.submit(lambda: (engine.close(), order.append("close returned")))
        wait_until(lambda: engine.closed, "close() to begin")
        go.set()
        closing.result()
        assert logits.result().shape == (engine.cfg.vocab_size,)
    assert order == ["forward ended", "close returned"]


def test_closing_a_remote_engine_ends_its_streaming_run_and_watcher():
    """In front of a server: close() aborts the open stream (the run ends "cancelled") and joins
    the thread that watched the run's cancel flag."""
    def one_then_hang(h, body):
        h.start_stream()
        h.event(chunk(120, "x"))
        server.release.wait(30)

    routes = {"/v1/models": (200, MODELS), "/v1/completions": one_then_hang,
              "/detokenize": lambda h, body: h.send_json(200, {"prompt": "".join(map(chr, body["tokens"]))}),
              "/tokenize": lambda h, body: h.send_json(200, {"tokens": [ord(c) for c in body["prompt"]]})}
    before = tokenlab_threads()
    params = SamplingParams(temperature=0, max_new_tokens=4)
    with FakeServer(routes) as server:
        with RemoteEngine.connect(server.url, logprobs="raw", timeout_s=30) as engine:
            events = engine.generate_ids([104], params, top_n=1, cancel=threading.Event())
            assert next(events).token_id == 120
            assert len(tokenlab_threads() - before) == 1  # the run's cancel watcher
        rest = list(events)
        assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "cancelled"
        assert rest[-1].generated_tokens == 1 and engine.active_runs == 0
        assert tokenlab_threads() <= before
        with pytest.raises(EngineClosed):
            list(engine.generate_ids([104], params, top_n=1))


# ------------------------------------------------------------------ the CLI's exit status


@pytest.mark.slow  # the CLI in a process of its own, held at its exit
def test_the_cli_exits_0_though_its_scheduler_is_computing_at_exit(tiny_dirs):
    """The moment of exit held open: after the run's last token the scheduler's thread goes on
    computing inside torch until the engine is closed (hooked.py busy-at-exit). Without the
    CLI's close every one of these runs aborted with exit 134 after printing all its JSONL."""
    cmd = cli("busy-at-exit", tiny_dirs["mha"])
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda _: subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                                       timeout=120), range(EXIT_RUNS)))
    for proc in procs:
        assert proc.returncode == 0 and ABORT not in proc.stderr, proc.stderr[-1000:]
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        assert lines[-1]["done"] is True and lines[-1]["generated_tokens"] == len(lines) - 1 == 3
        assert "alive at exit: []" in proc.stderr


def test_ctrl_c_prints_the_partial_run_an_interrupted_summary_and_exits_130(tiny_dirs, tmp_path):
    mark = tmp_path / "held"
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(cli("hold", tiny_dirs["mha"], max_new_tokens=50), stdout=stdout, stderr=stderr,
                                cwd=ROOT, env={**os.environ, "TOKENLAB_TEST_MARK": str(mark)})
        try:
            wait_until(mark.exists, "the run held before its third token")
            proc.send_signal(signal.SIGINT)
            code = proc.wait(60)
        finally:
            proc.kill()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    steps, done = lines[:-1], lines[-1]
    text = err.read_text()
    assert code == 130, text[-1000:]
    assert done["done"] is True and done["reason"] == "interrupted"
    assert done["generated_tokens"] == len(steps) >= 2 and done["text"] == "".join(s["text"] for s in steps) + done["tail"]
    assert "Traceback" not in text and ABORT not in text and "alive at exit: []" in text


def test_a_model_that_cannot_be_loaded_exits_1_with_one_line(tiny_dirs, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dirs["mha"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # cut off: the header promises more
    for model in (tmp_path / "missing", broken):
        assert main(["generate", "--model", str(model), "--prompt", "hi"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and len(err.splitlines()) == 1, err


# ------------------------------------------------------------------ the page


def test_the_page_stops_on_sigterm_with_a_run_streaming(tiny_dirs, tmp_path):
    """app.py with a visitor's run held mid-way (hooked.py hold): SIGTERM closes the page and
    the engine (which cancels the run) and the process exits 0, with no abort and no thread of
    ours left."""
    gradio_client = pytest.importorskip("gradio_client")
    port, mark = free_port(), tmp_path / "held"
    out, err = tmp_path / "out", tmp_path / "err"
    env = {**os.environ, "TOKENLAB_TEST_MARK": str(mark), "GRADIO_TEMP_DIR": str(tmp_path / "gradio")}
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(HOOKED), "hold", "app", "--model", str(tiny_dirs["gqa_tied"]),
                                 "--port", str(port)], stdout=stdout, stderr=stderr, cwd=ROOT, env=env)
        try:
            wait_until(lambda: "is running on" in out.read_text() or proc.poll() is not None, "the page to serve")
            client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
            client.submit(*page_api.call(max_new_tokens=50), api_name="/generate")
            wait_until(mark.exists, "the visitor's run held before its third token")
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        finally:
            proc.kill()
    text = err.read_text()
    assert code == 0, text[-1000:]
    assert "Token Lab stopped" in text and "alive at exit: []" in text
    assert ABORT not in text and "Traceback" not in text
    # A SIGTERM is no keyboard, and the page does not say it was one.
    assert "Keyboard interruption" not in out.read_text() + text


def test_a_signal_whose_interrupt_is_lost_still_ends_the_pages_wait():
    """A SIGTERM landing in code that swallows exceptions (a weakref's callback while the page
    started: CI saw the page serve on with its engine closed until it was killed) loses the
    KeyboardInterrupt app.py's handler raises. Its event is set all the same, and the page's wait
    ends at it although the page still runs."""
    from app import stop_on_signals
    from ui.layout import wait_until_stopped
    ran = []
    with stop_on_signals() as (before_stop, stopping):
        before_stop.append(lambda: ran.append("closed"))
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            pass  # swallowed, as "Exception ignored in: <function WeakValueDictionary...remove>"
        assert stopping.is_set() and ran == ["closed"]

        class Running:  # a page that never stops by itself
            is_running = True
        ended = []
        waiting = threading.Thread(target=lambda: ended.append(wait_until_stopped(Running(), stopping)), daemon=True)
        waiting.start()
        waiting.join(timeout=120)  # a bound on a hang, not a measured time: it returns at once
        assert ended == [None] and not waiting.is_alive()
