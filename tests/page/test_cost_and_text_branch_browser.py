"""Issue 63's lenses on the page, in chromium at 1400 and 420 px: a constrained run's bars say what
the constraint cost at the step (KL, the chosen token's free p, the free distribution's top tokens
it removed) and its statistics the output's log p with and without the renormalisation, with every
step's numbers folded under them; a token of a scored text clicked lists the choices to run from
it, and each starts a run in the run section (the text before it the prompt; a candidate given in
its place). Screenshots go to test-results/shots/test_cost_and_text_branch_browser/."""

import re
from urllib.parse import quote

import pytest

from browser import open_at, overflows, run_to_end, shot, wait_text
from ui.text_score.section import EXAMPLE

CONSTRAINED = ("prompt=The%20quick&seed=3&max_new_tokens=6&temperature=0.8&constraint=regex&constraint_text="
               + quote("[a-z ]{3,40}"))


def context_counts(text: str) -> tuple[int, int]:
    """(prompt, given) from a status line's "Context: ..." part."""
    m = re.search(r"Context: ([\d,]+) prompt(?: \+ ([\d,]+) given)?", text)
    assert m, text
    return int(m.group(1).replace(",", "")), int((m.group(2) or "0").replace(",", ""))


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_a_constrained_run_says_what_its_constraint_cost(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, CONSTRAINED)
    run_to_end(page, lambda: page.click("#generate"))
    wait_text(page, "#topk", "KL(constrained ‖ free) =")
    bars = page.inner_text("#topk")
    assert "gives the chosen token p =" in bars and "masked mass" in bars
    stats = page.inner_text("#stats")
    assert "log p, renormalised" in stats and "log p, free distribution" in stats
    assert not page.locator("#cost-steps table").is_visible()  # folded until asked for
    shot(page, f"cost-bars-{width}", selector="#topk")
    page.click("#cost-steps summary")
    rows = page.locator("#cost-steps tbody tr")
    rows.first.wait_for(state="visible")
    generated = len(page.locator("#output .tl-out [data-i]").all())
    assert rows.count() >= 1 and rows.count() == generated, (rows.count(), generated)
    assert not overflows(page)
    shot(page, f"cost-steps-{width}", selector="#stats")
    page.close()


def choices_for(page, chip) -> int:
    """Click a scored token; its choices come under the text. Its place in the ids as scored (the
    BOS the tiny model adds first)."""
    chip.click()
    wait_text(page, "#score-branch", "Run from here")
    return 1 + int(chip.get_attribute("data-i"))


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_a_token_of_a_scored_text_starts_a_run_from_there(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, "prompt=Hello&temperature=0&seed=1&max_new_tokens=4")
    page.get_by_text("Probability of a text: how likely").click()
    page.click("#score")
    wait_text(page, "#score-summary", "Perplexity")
    wait_text(page, "#score-branch", "Click a token")
    chip = page.locator("#score-view .tl-t").nth(5)
    at = choices_for(page, chip)
    assert page.locator("#score-branch .tl-cand").count() == 10
    assert not overflows(page)
    shot(page, f"from-text-choices-{width}", selector="#score-view")
    page.keyboard.press("Escape")  # the token's popover closes, as a tap elsewhere closes it
    page.mouse.move(0, 0)
    shot(page, f"from-text-panel-{width}", selector="#score-branch")
    run_to_end(page, lambda: page.click("#score-branch .tl-from-here"))
    wait_text(page, "#notice", f"A run from token {at} of the scored text")  # (the BOS before it is no token of the text)
    assert context_counts(page.inner_text("#status")) == (at, 0)
    prompt = page.input_value("#prompt textarea")
    assert prompt and EXAMPLE.startswith(prompt)  # the scored text up to the token
    assert page.evaluate("[...document.querySelectorAll('#mode input')].find((i) => i.checked)?.value") == "completion"
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, f"from-text-run-{width}")
    # A candidate put in the token's place: given, and the run continues after it.
    chip.scroll_into_view_if_needed()
    choices_for(page, chip)
    page.keyboard.press("Escape")
    page.mouse.move(0, 0)
    cand = page.locator("#score-branch .tl-cand:not(.tl-alt-chosen)").first
    run_to_end(page, lambda: cand.click())
    wait_text(page, "#notice", "is put in the place of")
    assert context_counts(page.inner_text("#status")) == (at, 1)
    assert page.locator("#output .tl-given").count() == 1
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, f"from-text-candidate-{width}")
    shot(page, f"from-text-candidate-output-{width}", selector="#output")
    page.close()
