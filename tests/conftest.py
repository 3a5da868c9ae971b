import os
import sys
from pathlib import Path

# Under pytest-xdist (scripts/test.sh) each worker's pages launched without a port search a range
# of their own (Gradio tries GRADIO_SERVER_PORT onward, 100 ports), so two workers never race for
# one port. Set before Gradio is imported: it reads the variable once.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ["GRADIO_SERVER_PORT"] = str(7860 + 200 * (1 + int(os.environ["PYTEST_XDIST_WORKER"][2:])))

# A closed tab's unload runs at the server's next heartbeat (Gradio's default: every 15 s); the
# tests that close one wait for it, so the suite's heartbeat is 2 s (tests/shared_page).
os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", "2")

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from engine_hold import Hold  # noqa: E402
from tiny_models import CONFIGS, make_tiny_model, train_sentencepiece  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives chromium through Playwright (tests/browser.py)")
    config.addinivalue_line("markers", "slow: among the slowest tests (a real model, a subprocess suite, "
                                       "lm-eval); the fast part: -m 'not browser and not slow'")


def pytest_collection_modifyitems(config, items):
    """Every test that opens the browser is marked `browser`: each one that uses the `browser`
    fixture (directly or through another fixture), and each one of a module that imports
    tests/browser.py."""
    for item in items:
        module = getattr(item, "module", None)
        uses_module = module is not None and any(getattr(v, "__module__", None) == "browser"
                                                 for v in vars(module).values())
        if "browser" in getattr(item, "fixturenames", ()) or uses_module:
            item.add_marker(pytest.mark.browser)
    # The longest files first, then the other browser files, then the rest: with two workers
    # taking whole files (--dist loadfile), a long file started last would leave one worker
    # idle at the end. An order only: a file missing from HEAVIEST runs after those in it.
    def rank(item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        if path in HEAVIEST:
            return (0, HEAVIEST.index(path))
        return (1, 0) if item.get_closest_marker("browser") else (2, 0)
    items.sort(key=rank)


# The files that take longest (seconds on the 2-core machine, pytest --durations=0, whole file).
HEAVIEST = ["tests/page/test_ui_page.py", "tests/tools/test_tokenlab_clone.py", "tests/page/test_edit_work_browser.py",
            "tests/page/test_layout_browser.py", "tests/model/test_kernels_isa.py",
            "tests/page/test_session_console_browser.py", "tests/page/test_run_view_browser.py",
            "tests/shared_page/test_session_memory.py", "tests/page/test_reload_mid_run_browser.py",
            "tests/tools/test_bench.py", "tests/decoding/test_speculative.py"]


@pytest.fixture(scope="session")
def sp_model_bytes() -> bytes:
    return train_sentencepiece(384)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, sp_model_bytes) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {name: make_tiny_model(root, name, seed=i, sp_model=sp_model_bytes)
            for i, name in enumerate(CONFIGS)}


@pytest.fixture(scope="session")
def tiny_engine(tiny_dirs):
    from inference.serving.engine import Engine
    with Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32") as engine:
        yield engine


@pytest.fixture
def h(tiny_engine):
    """The page's handlers on the tiny engine, 5 candidates a step (a test module may set its own)."""
    from ui.handlers import Handlers
    return Handlers(tiny_engine, top_n=5)


@pytest.fixture
def hold(monkeypatch):
    """hold(engine): a Hold on the engine's runs (engine_hold.py), let go when the test ends."""
    holds = []

    def make(engine) -> Hold:
        holds.append(Hold(monkeypatch, engine))
        return holds[-1]

    yield make
    for h in holds:
        h.open()


@pytest.fixture(scope="module")
def browser():
    """Chromium under Playwright (tests/browser.py), one per test module that asks for it."""
    from browser import chromium
    with chromium() as b:
        yield b


def no_early_end(engine) -> None:
    """Random weights give the end-of-sequence token a few percent at every step, so a run with a
    random seed could end at any step; the page's tests count steps: runs go to max new tokens."""
    engine.eos_ids = set()


@pytest.fixture(scope="module")
def served(request) -> str:
    """The page's address: TOKENLAB_SESSION_URL's (a page on real models, scripts/page_session.sh;
    browser.SESSION_MODELS the models it offers), else a page on the tiny model."""
    return (os.environ.get("TOKENLAB_SESSION_URL") or request.getfixturevalue("live_app")[0]).rstrip("/")


@pytest.fixture(scope="session")
def live_app(tiny_dirs):
    """The real page on a tiny model, served on a free localhost port."""
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui

    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    no_early_end(engine)
    handlers = Handlers(engine)
    demo = build_ui(engine, handlers)
    _, url, _ = serve(demo, engine, port=None, block=False)
    yield url.rstrip("/"), engine, handlers
    demo.close()
    engine.close()
