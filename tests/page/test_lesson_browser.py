"""The lesson "Follow one token" in chromium at 1400 and 420 px on the tiny model: its entry is in
view on the first screen, it opens on the page's prompt, Next and Back walk its 9 chapters, each
with its numbers and a link to a panel of the page, and nothing makes the page scroll sideways.
Screenshots of every chapter under test-results/shots/test_lesson_browser/.

On real models (scripts/page_session.sh serves SmolLM2 and Gemma 3 270M) each model's lesson is
walked on the page's prompt and then on the example 今天天气真, every chapter shot at both widths."""

import re
from urllib.parse import quote

import pytest

from browser import SESSION_MODELS, SIZES, box, open_at, overflows, shot, wait_text

QUERY = "prompt=The%20quick%20brown%20fox&seed=1"
TITLES = ("Tokenize", "Embed", "Position (RoPE)", "Layers", "LM head", "Sampling", "Prefill and decode",
          "The KV cache", "FLOPs per token")


def walk(page, name: str, prompt: str) -> list[str]:
    """Every chapter in turn with Next, each shot; the chapters' texts."""
    seen = []
    for k, title in enumerate(TITLES, 1):
        wait_text(page, "#lesson-view", f"Chapter {k} of 9: {title}")
        view = page.inner_text("#lesson-view")
        assert prompt in view and "Explore further on this page" in view
        assert page.locator("#lesson-view .lesson-explore a").count() >= 1
        assert not overflows(page), f"chapter {k} makes the page scroll sideways"
        shot(page, f"{name}chapter{k}", selector="#lesson-panel")
        seen.append(view)
        if k < len(TITLES):
            page.click("#lesson-next")
    assert page.locator("#lesson-next").is_disabled()
    return seen


@pytest.mark.parametrize("model", SESSION_MODELS)
@pytest.mark.parametrize("width,height", SIZES)
def test_lesson_entry_opens_every_chapter(served, browser, width, height, model):
    page = open_at(browser, served, width, height, QUERY + (f"&model={quote(model)}" if model else ""))
    if model:  # the page's picker loads the model first; until then Generate is off
        page.wait_for_selector("#generate:not([disabled])")
    entry = box(page, "#lesson")
    assert entry["y"] >= 0 and entry["y"] + entry["height"] <= height  # in view without scrolling
    assert "Follow one token" in page.inner_text("#lesson")
    page.click("#lesson")
    wait_text(page, "#lesson-view", "Chapter 1 of 9")
    assert page.input_value("#lesson-prompt textarea") == "The quick brown fox"
    name = f"{model}-{width}-" if model else f"{width}-"
    walk(page, name, "The quick brown fox")
    page.click("#lesson-back")
    wait_text(page, "#lesson-view", "Chapter 8 of 9")
    if model:  # the classic example on a real model: what its tokenizer makes of it, and 好
        page.click("#lesson-example-1")  # 今天天气真
        wait_text(page, "#lesson-view", "Chapter 1 of 9: Tokenize")
        chapters = walk(page, f"{name}zh-", "今天天气真")
        if model.startswith("gemma"):  # <bos> 今天 天气 真, and 好 the top candidate
            assert "今天" in chapters[0] and "天气" in chapters[0]
            assert re.search(r"^1\s+好\s", chapters[4], re.M), "好 is not the LM head's top candidate"
        else:  # SmolLM2's byte-level tokens, each character named
            assert "= 今" in chapters[0]
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
