"""The page audit's defects, checked at the handlers (the browser's checks are in
test_audit_browser.py). One test per defect, named after it."""

from types import SimpleNamespace

import pytest

from engine_hold import fail_mid_run
from inference.errors import InputError
from ui.controls import Controls
from ui.handlers import Handlers

REQ = SimpleNamespace(session_hash="audit")


@pytest.fixture
def h(tiny_engine):
    return Handlers(tiny_engine, top_n=5)


def controls(**kw) -> Controls:
    return Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 6, "seed": "3", **kw})


@pytest.mark.parametrize("beyond", [0, 1, None])
def test_a_logit_bias_beyond_the_vocabulary_is_refused_before_the_run(h, tiny_engine, beyond):
    """begin says it in the status line, by its label, as the CLI words it; no run is queued."""
    vocab = tiny_engine.cfg.vocab_size
    tid = 999_999 if beyond is None else vocab + beyond  # the audit's ids: the size, one past, far past
    c = controls(logit_bias=f"{tid}:5")
    out = h.begin(*c.values(), REQ)
    assert out == {"status": f"⚠ Not started: Logit bias names token {tid} but the vocabulary has {vocab} tokens"}
    assert "audit" not in h._waiting
    assert list(h.generate_on_page(*c.values(), REQ)) == [{}]
    # The last id of the vocabulary is a token: it runs.
    ok = controls(logit_bias=f"{vocab - 1}:5")
    assert "record" in h.begin(*ok.values(), REQ)


@pytest.mark.parametrize("error", [InputError("the engine failed (a test's error)", field="logit_bias"),
                                   RuntimeError("out of memory\nsomewhere")])
def test_an_engine_error_mid_run_ends_the_run(h, tiny_engine, monkeypatch, error):
    """The page's run ends: its last update says the error in one line (a field by its label),
    and after_run enables Generate, disables Stop and stops the chart timer."""
    fail_mid_run(monkeypatch, tiny_engine, error)
    c = controls()
    h.begin(*c.values(), REQ)
    updates = list(h.generate_on_page(*c.values(), REQ))
    line = ("Logit bias: the engine failed (a test's error)" if isinstance(error, InputError)
            else "RuntimeError: out of memory somewhere")
    rec = updates[-1]["record"]
    assert updates[-1]["status"] == f"⚠ The run failed: {line}" and len(rec.steps) == 1 and rec.done is None
    after = h.after_run(rec, [], REQ)
    assert after["status"] == f"⚠ The run failed: {line}"
    assert after["generate"]["interactive"] is True and after["stop_button"]["interactive"] is False
    assert after["live"].active is False
    assert not h.registry.running("audit")  # the job is let go: the next run may start
