"""The launched app driven through gradio_client, as scripts and other users would."""

from helpers import plain
import pytest

from engine_hold import wait_until
from page_api import call, output

gradio_client = pytest.importorskip("gradio_client")


def test_generate_streams_over_the_api(live_app):
    url, engine, _ = live_app
    client = gradio_client.Client(url, verbose=False)
    job = client.submit(*call(), api_name="/generate")
    updates = list(job)
    assert len(updates) >= 2  # the first update (an empty output) arrives before generation ends
    final = updates[-1]
    tokens = output(final, "api_tokens")  # the tokens: text, probability and step of each
    assert len(tokens) == 20 and all({"token", "prob", "step"} <= set(t) for t in tokens)
    assert "Step 19" in plain(output(final, "bars")) and "20 |" in plain(output(final, "stats"))
    # The same seed over the API gives the same tokens as the engine alone.
    from inference.serving.engine import Request
    from inference.sampling.params import SamplingParams
    direct = list(engine.generate(Request("The quick", SamplingParams(temperature=0.0, max_new_tokens=20, seed=5))))
    assert "".join(t["token"] for t in tokens) == direct[-1].text


def test_stop_over_the_api_ends_the_run_and_frees_it(live_app, hold):
    url, engine, handlers = live_app
    held = hold(engine)
    client = gradio_client.Client(url, verbose=False)
    job = client.submit(*call(temperature=1.0, max_new_tokens=240), api_name="/generate")
    held.step(3)  # the run has made 3 tokens and is held before the 4th
    client.predict(api_name="/stop")
    final = job.result()
    assert "**stopped on request" in output(final, "stats")
    generated = next(r for r in output(final, "stats").splitlines() if r.startswith("| generated |")).split("|")[2]
    assert int(generated) == 4  # 3 + the one at the Stop (the output groups bytes into characters)
    wait_until(lambda: engine.active_runs == 0 and len(handlers.page.registry) == 0, "the run's end")


def test_bad_input_is_a_clear_error_and_the_app_keeps_serving(live_app):
    url, _, _ = live_app
    client = gradio_client.Client(url, verbose=False)
    for kw, message in [(dict(prompt=""), "empty"), (dict(temperature=-1.0), "temperature must be in"),
                        (dict(top_p=5.0), "top_p must be in"), (dict(seed="x"), "seed"),
                        (dict(top_k=-2), "top_k must be in"), (dict(top_k=2.5), "top_k must be a whole number")]:
        with pytest.raises(Exception, match=message):
            client.predict(*call(**kw), api_name="/generate")
    assert len(output(client.predict(*call(max_new_tokens=3), api_name="/generate"), "api_tokens")) == 3


def test_eight_clients_at_once_match_their_solo_runs(live_app):
    from concurrent.futures import ThreadPoolExecutor
    url, engine, _ = live_app

    def run(i):
        client = gradio_client.Client(url, verbose=False)
        out = client.predict(*call(prompt=f"Story {i}:", temperature=1.0, top_k=20, max_new_tokens=15,
                                   seed=str(10 + i)), api_name="/generate")
        return "".join(t["token"] for t in output(out, "api_tokens"))

    solo = [run(i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(run, range(8)))
    assert together == solo and len(set(solo)) == 8
    assert engine.active_runs == 0


def test_a_full_queue_says_busy(tiny_dirs, hold):
    from concurrent.futures import ThreadPoolExecutor, as_completed
    from inference.serving.engine import Engine
    from app import serve
    from ui.layout import build_ui

    engine = Engine.from_hf_dir(tiny_dirs["mha"])
    held = hold(engine)  # the first run waits at its first forward pass: the queue stays full
    demo = build_ui(engine)
    # One run at a time and one place in the queue: with the first run held, the second waits in
    # the queue and the rest find it full, whatever order they arrive in.
    _, url, _ = serve(demo, engine, block=False, queue_size=1, concurrency=1)
    try:
        clients = [gradio_client.Client(url, verbose=False) for _ in range(5)]  # connected first

        def run(client):
            try:
                client.predict(*call(max_new_tokens=100), api_name="/generate")
                return "ok"
            except Exception as e:
                return str(e)

        with ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(run, c) for c in clients]
            try:  # while the run is held, only a refusal can come back
                first = next(as_completed(futures, timeout=60)).result()
            finally:
                held.open()
            results = [f.result() for f in futures]
    finally:
        demo.close()
    assert first != "ok" and "ok" in results
    busy = [r for r in results if r != "ok"]
    assert busy and all("full" in r.lower() or "try again" in r.lower() for r in busy), results


def test_a_client_that_disconnects_ends_its_run(live_app, hold):
    url, engine, handlers = live_app
    held = hold(engine)
    held.one_token_per_update()  # the run can only advance while the client takes updates
    client = gradio_client.Client(url, verbose=False)
    job = client.submit(*call(temperature=1.0, max_new_tokens=240), api_name="/generate")
    updates = iter(job)
    for _ in range(3):
        next(updates)
    assert engine.active_runs == 1
    job.cancel()
    client.close()
    wait_until(lambda: engine.active_runs == 0 and len(handlers.page.registry) == 0, "the run's end")
    assert held.started < 240


def test_the_queue_polls_gently(tiny_engine, monkeypatch):
    """Gradio's queue would wake every 1 ms and take the GIL from the engine's thread: its idle
    loop, run here, waits 20 ms. If a Gradio upgrade renames or drops the setting this fails
    instead of the tuning silently going away."""
    import asyncio
    from ui.handlers import Handlers
    from ui.layout import build_ui, configure_queue
    demo = build_ui(tiny_engine, Handlers(tiny_engine))
    configure_queue(demo, tiny_engine)
    queue, waits, loop, sleep = demo._queue, [], asyncio.new_event_loop(), asyncio.sleep

    async def watched_sleep(delay, *args, **kwargs):
        if asyncio.get_running_loop() is not loop:  # another test's server
            return await sleep(delay, *args, **kwargs)
        waits.append(delay)
        queue.stopped = True

    monkeypatch.setattr(asyncio, "sleep", watched_sleep)
    try:
        loop.run_until_complete(asyncio.wait_for(queue.start_processing(), 60))
    finally:
        loop.close()
    assert waits == [0.02]
    assert queue.max_size == 16


def test_gradios_matplotlib_guard_searches_no_paths_where_matplotlib_is_absent(tiny_engine, monkeypatch):
    """Gradio imports matplotlib entering and leaving every event; configure_queue records an
    absent matplotlib so that those imports fail without searching sys.path each time."""
    import importlib.machinery
    import importlib.util
    import sys
    from gradio.utils import MatplotlibBackendMananger
    from ui.handlers import Handlers
    from ui.layout import build_ui, configure_queue
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed here: its import succeeds and is kept")
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)  # as a fresh process has it
    searches = []
    find_spec = importlib.machinery.PathFinder.find_spec
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", classmethod(
        lambda cls, name, *a, **k: searches.append(name) or find_spec(name, *a, **k)))
    with MatplotlibBackendMananger():
        pass
    assert searches.count("matplotlib") == 2  # what every event cost before
    configure_queue(build_ui(tiny_engine, Handlers(tiny_engine)), tiny_engine)
    searches.clear()
    with MatplotlibBackendMananger():
        pass
    assert searches == []
    with pytest.raises(ImportError):
        import matplotlib  # noqa: F401
