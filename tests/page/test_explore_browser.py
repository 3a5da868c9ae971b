"""The "Many samples" and "Probability of a text" panels in chromium, at 1400 and 420 px: they
work for a person (the click, the tables, a token's popover and its alternatives), and nothing
needs sideways scrolling of the page. Screenshots go to test-results/shots/test_explore_browser/."""

import pytest

from browser import generate_to_end, open_page, overflows, set_slider, shot, wait_loaded, wait_text
from engine_hold import wait_until


def open_panel(browser, url: str, width: int, height: int, query: str, panel: str):
    """The page at this size with the link's settings, the panel's accordion opened."""
    page = open_page(browser, viewport={"width": width, "height": height})
    page.goto(url + "/?" + query)
    wait_loaded(page)
    page.get_by_text(panel).click()
    return page


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_many_samples_panel(live_app, browser, width, height):
    url, engine, _ = live_app
    page = open_panel(browser, url, width, height, "prompt=The%20quick&temperature=1&seed=3&max_new_tokens=4",
                      "Many samples: draw N")
    set_slider(page, "#n-samples", 24)  # held before the click: a click could beat it and draw the old N
    page.click("#samples")
    wait_text(page, "#samples-summary", "24 samples")
    wait_text(page, "#samples-first", "Chi-square")
    assert "seeds 3–26" in page.inner_text("#samples-summary")
    assert page.locator("#samples-outcomes tr").count() >= 2
    assert page.locator("#samples-first tr").count() >= 3
    page.wait_for_function("!document.querySelector('#samples').disabled")  # the button is back
    assert not overflows(page)
    page.locator("#samples-first").scroll_into_view_if_needed()
    page.locator("#samples-summary").scroll_into_view_if_needed()
    shot(page, f"samples-{width}")
    # Every sample's run ends (its blocks back in the pool a moment after its last event).
    wait_until(lambda: engine.active_runs == 0, "the samples' runs ending")
    page.close()


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_probability_of_a_text_panel(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_panel(browser, url, width, height, "prompt=The%20quick&temperature=0&seed=1&max_new_tokens=3",
                      "Probability of a text: how likely")
    page.fill("#score-text textarea", "The quick brown fox. 鲸")
    page.click("#score")
    wait_text(page, "#score-summary", "Perplexity")
    chips = page.locator("#score-view .tl-t")
    assert chips.count() >= 5
    chips.nth(2).hover()
    pop = chips.nth(2).locator(".tl-pop")
    assert pop.is_visible() and "rank" in pop.inner_text() and "bits" in pop.inner_text()
    assert not pop.locator(".tl-more").is_visible()  # the alternatives come on a click
    chips.nth(2).click()
    page.mouse.move(0, 0)
    assert pop.locator(".tl-more").is_visible() and pop.locator(".tl-alt").count() == 10
    assert not overflows(page)
    shot(page, f"score-text-{width}")
    # The run's prompt as fed, into the box and scored.
    generate_to_end(page)
    page.click("#score-prompt")
    page.wait_for_function("document.querySelector('#score-text textarea').value === 'The quick'")
    wait_text(page, "#score-summary", "The prompt of the run, as fed")
    page.close()
