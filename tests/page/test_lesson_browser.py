"""The lesson "Follow one token" in chromium at 1400 and 420 px on the tiny model: its entry is in
view on the first screen, it opens on the page's prompt, Next and Back walk its 9 chapters, each
with its numbers and a link to a panel of the page, and nothing makes the page scroll sideways.
Screenshots of every chapter under test-results/shots/test_lesson_browser/."""

import pytest

from browser import SIZES, box, open_at, overflows, shot, wait_text

QUERY = "prompt=The%20quick%20brown%20fox&seed=1"
TITLES = ("Tokenize", "Embed", "Position (RoPE)", "Layers", "LM head", "Sampling", "Prefill and decode",
          "The KV cache", "FLOPs per token")


@pytest.mark.parametrize("width,height", SIZES)
def test_lesson_entry_opens_every_chapter(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, QUERY)
    entry = box(page, "#lesson")
    assert entry["y"] >= 0 and entry["y"] + entry["height"] <= height  # in view without scrolling
    assert "Follow one token" in page.inner_text("#lesson")
    page.click("#lesson")
    wait_text(page, "#lesson-view", "Chapter 1 of 9")
    assert page.input_value("#lesson-prompt textarea") == "The quick brown fox"
    for k, title in enumerate(TITLES, 1):
        wait_text(page, "#lesson-view", f"Chapter {k} of 9: {title}")
        view = page.inner_text("#lesson-view")
        assert "The quick brown fox" in view and "Explore further on this page" in view
        assert page.locator("#lesson-view .lesson-explore a").count() >= 1
        assert not overflows(page), f"chapter {k} makes the page scroll sideways"
        shot(page, f"chapter{k}-{width}", selector="#lesson-panel")
        if k < len(TITLES):
            page.click("#lesson-next")
    assert page.locator("#lesson-next").is_disabled()
    page.click("#lesson-back")
    wait_text(page, "#lesson-view", "Chapter 8 of 9")
    page.click("#lesson-close")
    page.wait_for_selector("#lesson-panel", state="hidden")
    page.close()


def test_lesson_example_and_refusal(live_app, browser):
    url, _, _ = live_app
    page = open_at(browser, url, 1400, 1000, QUERY)
    page.click("#lesson")
    wait_text(page, "#lesson-view", "Chapter 1 of 9")
    page.click("#lesson-example-1")  # 今天天气真
    wait_text(page, "#lesson-view", "今天天气真")
    page.fill("#lesson-prompt textarea", "   ")
    page.click("#lesson-start")
    wait_text(page, "#lesson-view", "Type a prompt first")
    assert page.locator("#lesson-next").is_disabled()
    page.close()
