"""The controls at the handlers: a regenerate with a fixed seed says the answer will be the same, a
new conversation and completion mode clear the chat, and a temperature typed beyond its range is
said (the browser's checks are in test_controls_browser.py)."""

from types import SimpleNamespace

import pytest

from ui.chat import conversation_html
from ui.controls import Controls
from ui.handlers import Handlers
import ui.run.render as run_render

REQ = SimpleNamespace(session_hash="controls")


@pytest.fixture
def h(tiny_engine):
    return Handlers(tiny_engine, top_n=5)


def run(h, **kw):
    c = Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 8, "seed": "3", **kw})
    return list(h.generate(*c.values(), REQ))[-1]["record"]


def test_regenerate_with_a_seed_says_the_answer_will_be_the_same(h):
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    popped = h.pop_last_turn(history, "42")
    assert "Seed 42 is fixed" in popped["chat_note"] and "clear the seed" in popped["chat_note"]
    assert h.pop_last_turn(history, "")["chat_note"] == ""
    # And it is true: the same seed gives the same answer, a cleared one a different seed.
    a = run(h, mode="chat", prompt="Hi", seed="42", temperature=1.0)
    b = run(h, mode="chat", prompt="Hi", seed="42", temperature=1.0)
    assert [s.token_id for s in a.steps] == [s.token_id for s in b.steps]


def test_new_conversation_and_completion_mode_clear_the_chat(h):
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    kept = h.count_context("", "chat", "", 8, history)
    assert "1 earlier turn kept" in kept
    new = h.new_conversation("", "chat", "", 8, "")
    assert new["history"] == [] and new["conversation"] == "" and new["chat_note"] == ""
    assert "earlier turn" not in new["context_count"] and new["context_count"] == h.count_context("", "chat", "", 8, [])
    assert h.switch_mode("completion")["conversation"]["visible"] is False
    assert h.switch_mode("chat")["conversation"]["visible"] is True
    assert "1 turn" in conversation_html(history)  # kept, shown again back in chat mode


def test_typed_temperature_beyond_its_range_is_said():
    js = open(run_render.__file__.rsplit("/run/", 1)[0] + "/assets/clamp.js", encoding="utf-8").read()
    assert "is above the maximum" in js and "tl-setting" in js  # the browser test types 5
