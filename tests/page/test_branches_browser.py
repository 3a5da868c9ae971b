"""A branch on the page, in chromium at 1400 and 420 px: a candidate clicked continues the run
with max new tokens as the person set it, the counters count the given tokens, and a prompt typed
by hand afterwards leaves the branch (the next run has no given tokens). Screenshots go to
test-results/shots/test_branches_browser/."""

import re

import pytest

from browser import open_page, run_to_end, shot, wait_loaded

QUERY = "?prompt=The%20quick&temperature=0&seed=1&max_new_tokens=6"


def counts(text: str) -> tuple[int, int, int, int]:
    """(prompt, given, generated, total) from a status line's "Context: ..." part."""
    m = re.search(r"Context: ([\d,]+) prompt(?: \+ ([\d,]+) given)? \+ ([\d,]+) generated = ([\d,]+) of", text)
    assert m, text
    return tuple(int((g or "0").replace(",", "")) for g in m.groups())


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_a_branch_keeps_max_new_tokens_counts_its_given_tokens_and_a_new_prompt_leaves_it(
        live_app, browser, width, height):
    url, engine, _ = live_app
    page = open_page(browser, viewport={"width": width, "height": height})
    page.goto(url + "/" + QUERY)
    wait_loaded(page)
    run_to_end(page, lambda: page.click("#generate"))
    root = counts(page.inner_text("#status"))
    assert root[1] == 0 and root[2] == 6 and root[3] == root[0] + 6
    # A candidate of step 2 (the bars show the last step: go there first) other than the one taken.
    page.evaluate("window.scrollTo(0, 0)")
    step = page.locator("#step input[type=number]")
    step.fill("2")
    step.press("Enter")
    page.wait_for_function("document.querySelector('#topk [data-pick]')?.dataset.pick?.startsWith('2:')")
    chosen = page.locator("#topk .tl-row.tl-pick:not(.tl-chosen)").first.get_attribute("data-pick")
    run_to_end(page, lambda: page.locator(f"#topk [data-pick='{chosen}']").click())
    page.wait_for_function("document.querySelectorAll('#branches .tl-branch').length === 2")
    # The person's max new tokens stays; the branch makes that many after its 3 given tokens.
    assert page.input_value("#max-new-tokens input[type=number]") == "6"
    branch = counts(page.inner_text("#status"))
    assert branch == (root[0], 3, 6, root[0] + 3 + 6)
    assert page.inner_text("#output .tl-given") != ""
    stats = page.inner_text("#stats")
    assert re.search(r"given tokens \(continued after\)\s+3", stats) and f"at {root[0] + 3 + 6} ctx" in stats
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, f"branch-{width}")
    # Re-running the branch's settings (Generate, prompt untouched) runs the branch again.
    assert "3 given" in page.inner_text("#context-count")
    # A prompt typed by hand leaves the branch: the counter and the next run have no given tokens.
    page.fill("#prompt textarea", "Once upon")
    page.locator("#prompt textarea").type("a")
    page.wait_for_function("!document.querySelector('#context-count').innerText.includes('given')")
    run_to_end(page, lambda: page.click("#generate"))
    fresh = counts(page.inner_text("#status"))
    assert fresh[1] == 0 and fresh[2] == 6
    assert page.locator("#output .tl-given").count() == 0
    assert page.input_value("#max-new-tokens input[type=number]") == "6"
    shot(page, f"after-new-prompt-{width}")
    page.close()
