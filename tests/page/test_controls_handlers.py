"""The controls at the handlers: a regenerate with a fixed seed says the answer will be the same, a
new conversation and completion mode clear the chat, a temperature typed beyond its range is
said, and a number box's label says what its zero does (the browser's checks are in
test_controls_browser.py)."""

from types import SimpleNamespace

from helpers import page_run
from ui.shared.conversation import conversation_html
import ui.shared.view as run_render

REQ = SimpleNamespace(session_hash="controls")


def run(h, **kw):
    return page_run(h, REQ, **kw)


def test_regenerate_with_a_seed_says_the_answer_will_be_the_same(h):
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    popped = h.chat.pop_last_turn(history, "42")
    assert "Seed 42 is fixed" in popped["chat_note"] and "clear the seed" in popped["chat_note"]
    assert h.chat.pop_last_turn(history, "")["chat_note"] == ""
    # And it is true: the same seed gives the same answer, a cleared one a different seed.
    a = run(h, mode="chat", prompt="Hi", seed="42", temperature=1.0)
    b = run(h, mode="chat", prompt="Hi", seed="42", temperature=1.0)
    assert [s.token_id for s in a.steps] == [s.token_id for s in b.steps]


def test_new_conversation_and_completion_mode_clear_the_chat(h):
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    kept = h.page.runs.count_context("", "chat", "", 8, history)
    assert "1 earlier turn kept" in kept
    new = h.chat.new_conversation("", "chat", "", 8, "")
    assert new["history"] == [] and new["conversation"] == "" and new["chat_note"] == ""
    assert "earlier turn" not in new["context_count"] and new["context_count"] == h.page.runs.count_context("", "chat", "", 8, [])
    assert h.chat.switch_mode("completion")["conversation"]["visible"] is False
    assert h.chat.switch_mode("chat")["conversation"]["visible"] is True
    assert "1 turn" in conversation_html(history)  # kept, shown again back in chat mode


def test_typed_temperature_beyond_its_range_is_said():
    js = open(run_render.__file__.rsplit("/shared/", 1)[0] + "/assets/clamp.js", encoding="utf-8").read()
    assert "is above the maximum" in js and "tl-setting" in js  # the browser test types 5


def test_a_number_box_label_says_what_its_zero_does_as_its_help_does():
    """Each number box's label says what its off value does, in the words its help uses (DRY
    range: 0 searches the whole context, so "0 = all", not "0 = default")."""
    import re
    from inference.sampling.settings import SETTINGS
    from ui.widgets import setting_control
    boxes = {s.name: (s, setting_control(s, s.default, 256)) for s in SETTINGS if s.control == "number"}
    assert boxes["dry_penalty_last_n"][1].label == "DRY range (0 = all)"
    assert boxes["top_k"][1].label == "Top-k (0 = off)"
    for s, box in boxes.values():
        said = re.fullmatch(re.escape(s.label) + r" \((.+)\)", box.label).group(1)
        assert said in s.help, (box.label, s.help)
