"""The page's lesson handlers (ui/lesson) on the tiny engine: the chapters shown are the numbers
explain() computes, Back and Next stay within the lesson, a refusal is one line."""

from inference.lesson.explain import CHAPTERS
from ui.controls import Controls


def start(h, prompt, **controls):
    """The lesson's Start as the page sends it: every control, then the lesson's prompt."""
    return h.lesson.lesson_start(*Controls(**controls).values(), prompt)


def test_start_shows_chapter_one_and_moves_within_the_lesson(h):
    out = start(h, "The quick brown fox", temperature=0.7, top_p=0.8, seed="5")
    data = out["lesson_data"]
    assert [c["key"] for c in data["chapters"]] == [k for k, _ in CHAPTERS]
    ids = data["chapters"][0]["ids"]
    assert ids == h.page.engine.tokenizer.encode("The quick brown fox")
    view = out["lesson_view"]
    assert "Chapter 1 of 9: Tokenize" in view and f"<td>{ids[-1]}</td>" in view
    assert out["lesson_index"] == 0 and out["lesson_back"]["interactive"] is False
    moved = h.lesson.lesson_next(data, 0)
    assert moved["lesson_index"] == 1 and "Chapter 2 of 9: Embed" in moved["lesson_view"]
    last = h.lesson.lesson_next(data, 8)
    assert last["lesson_index"] == 8 and last["lesson_next"]["interactive"] is False
    assert "LLaMA-7B" in last["lesson_view"]
    assert h.lesson.lesson_back(data, 0)["lesson_index"] == 0
    settings = data["chapters"][5]["settings"]  # the page's settings and seed, not the model's defaults
    assert (settings["temperature"], settings["top_p"], settings["seed"]) == (0.7, 0.8, 5)


def test_every_chapter_names_a_panel_that_exists(h):
    from ui.layout import build_ui
    from ui.lesson.render import EXPLORE
    demo = build_ui(h.page.engine, h)
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    assert set(EXPLORE) == {k for k, _ in CHAPTERS}
    for key, links in EXPLORE.items():
        for elem_id, _ in links:
            assert elem_id in ids, (key, elem_id)


def test_an_empty_prompt_is_refused_in_one_line(h):
    out = start(h, "  ")
    assert out["lesson_data"] is None and "Type a prompt first" in out["lesson_view"]
    out = start(h, "The quick brown fox", top_p=1.5)  # a setting a run refuses: named in one line
    assert out["lesson_data"] is None and "Top-p" in out["lesson_view"] and "\n" not in out["lesson_view"]
    assert h.lesson.lesson_next(None, 0)["lesson_next"]["interactive"] is False
