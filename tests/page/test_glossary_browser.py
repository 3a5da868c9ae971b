"""The first screen and the glossary in chromium at 1400 × 900 and 420 × 900: the prompt, Generate
and the lesson's entry are in the window without scrolling; a term of the model card, of the
bars, of the lesson and a control's label shows its definition on hover, on keyboard focus and
on a tap, and a screen reader gets it as the term's description (the accessibility tree's).
Screenshots under test-results/shots/test_glossary_browser/.

On real models (scripts/page_session.sh serves SmolLM2 and Gemma 3 270M) each model's page is
checked, opened with ?model=NAME."""

from urllib.parse import quote

import pytest

from browser import SESSION_MODELS, WAIT_MS, box, run_to_end, shot, wait_loaded, wait_text, watch
from ui import glossary

FIRST = [(1400, 900), (420, 900)]
TIP = "#tl-tip:not([hidden])"


def open_first(browser, served, width, height, model, query="", touch=False):
    context = browser.new_context(viewport={"width": width, "height": height}, has_touch=touch)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.seen = watch(page)  # no console error, page error or HTTP error, checked at the end
    pick = f"model={quote(model)}" if model else ""
    page.goto(served + "/?" + "&".join(q for q in (query, pick) if q))
    wait_loaded(page)
    page.wait_for_function("window.tlGlossary === true")  # the page's glossary script is in
    if model:  # the picker loads the model first; until then Generate is off
        page.wait_for_selector("#generate:not([disabled])")
    return page


def described(page, selector: str) -> str:
    """The element's accessible description, as chromium's accessibility tree gives it to a screen reader."""
    cdp = page.context.new_cdp_session(page)
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    backend = cdp.send("DOM.describeNode", {"nodeId": node})["node"]["backendNodeId"]
    ax = cdp.send("Accessibility.getPartialAXTree", {"backendNodeId": backend, "fetchRelatives": False})["nodes"][0]
    return (ax.get("description") or {}).get("value", "")


def shows(page, selector: str, term: str) -> None:
    """The tooltip is on and says the term's definition."""
    page.wait_for_selector(TIP, timeout=20_000)
    text = page.inner_text("#tl-tip")
    assert glossary.define(term) in text and text.startswith(term), text


@pytest.mark.parametrize("model", SESSION_MODELS)
@pytest.mark.parametrize("width,height", FIRST)
def test_the_first_screen_holds_the_prompt_generate_and_the_lesson(served, browser, width, height, model):
    page = open_first(browser, served, width, height, model)
    for sel in ("#prompt textarea", "#generate", "#lesson"):
        b = box(page, sel)
        assert b["y"] >= 0 and b["y"] + b["height"] <= height, f"{sel} is not in the first screen: {b}"
    shot(page, f"first-screen-{model or 'tiny'}-{width}")
    page.context.close()
    assert page.seen["errors"] == [] and page.seen["http"] == [], page.seen


@pytest.mark.parametrize("model", SESSION_MODELS)
@pytest.mark.parametrize("width,height", FIRST)
def test_a_term_shows_its_definition_on_hover_focus_and_tap_and_to_a_screen_reader(served, browser, width, height,
                                                                                 model):
    page = open_first(browser, served, width, height, model, "prompt=The%20quick%20brown%20fox&mode=completion",
                      touch=width < 800)
    card = "#model-card .tl-term[data-term='KV heads']"
    page.locator(card).first.scroll_into_view_if_needed()
    if width < 800:
        page.locator(card).first.tap()  # a phone: the tap focuses the term
    else:
        page.locator(card).first.hover()
    shows(page, card, "KV heads")
    shot(page, f"card-definition-{model or 'tiny'}-{width}")
    assert described(page, card) == glossary.define("KV heads")
    page.keyboard.press("Escape")
    page.wait_for_selector("#tl-tip", state="hidden")
    page.locator(card).first.blur()
    page.locator(card).first.focus()  # the keyboard: Tab reaches the term
    shows(page, card, "KV heads")
    page.mouse.click(5, 5)
    page.locator(card).first.blur()
    # A control's label that is a term (Temperature): marked by the page's script, described too.
    label = "#temperature [data-testid='block-info'] .tl-term"
    page.wait_for_selector(label)
    assert described(page, label) == glossary.define("Temperature")
    page.locator(label).focus()
    shows(page, label, "Temperature")
    page.locator(label).blur()
    # The bars of a run: their header's terms.
    page.fill("#seed input, #seed textarea", "3")
    page.locator("#max-new-tokens input[type=number]").fill("4")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    run_to_end(page, lambda: page.click("#generate"))
    bar = "#topk .tl-term[data-term='raw']"
    page.locator(bar).first.focus()
    shows(page, bar, "raw")
    shot(page, f"bars-definition-{model or 'tiny'}-{width}", selector="#topk")
    page.locator(bar).first.blur()
    # The lesson: a term of its first chapter.
    page.click("#lesson")
    wait_text(page, "#lesson-view", "Chapter 1 of 9")
    term = "#lesson-view .lesson-text .tl-term[data-term='tokenizer']"
    page.locator(term).first.scroll_into_view_if_needed()
    page.locator(term).first.focus()
    shows(page, term, "tokenizer")
    assert described(page, term) == glossary.define("tokenizer")
    shot(page, f"lesson-definition-{model or 'tiny'}-{width}")
    page.context.close()
    assert page.seen["errors"] == [] and page.seen["http"] == [], page.seen
