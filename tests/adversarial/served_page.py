"""What the tests of issue 59's findings share: the page and its API on a tiny model (a fixture each
test module imports; not a conftest.py, whose module name the top-level one's imports would find)."""

from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def page(tiny_dirs):
    """The page with the API beside it on the tiny model, served on a free port; its runs never end
    at the end-of-sequence token (random weights give it a few percent a step)."""
    from app import serve
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from ui.layout import build_ui

    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    engine.eos_ids = set()
    handlers = Handlers(engine)
    demo = build_ui(engine, handlers)
    _, url, _ = serve(demo, engine, block=False)
    yield SimpleNamespace(url=url.rstrip("/"), engine=engine, handlers=handlers, demo=demo)
    demo.close()
    engine.close()
