"""The "Probability of a text" panel refusing in chromium, at 1400 and 420 px: the prompt scored
before a run, an empty text, a text longer than the context window. Each says why in one line
where the summary goes; the Text box keeps what was typed, and no Gradio error badge covers it or
the result. Screenshots go to test-results/shots/test_text_score_browser/."""

import pytest

from browser import open_at, shot
from ui.text_score.section import EXAMPLE

LONG = "x" * 40_000  # the tiny model's context window is 256 tokens

# Gradio's error badge (its status tracker's "Error") and its toast, where one shows in the panel.
SHOWN_ERRORS_JS = """() => [...document.querySelectorAll(
        "#score-panel [data-testid='status-tracker'] .error, [data-testid='toast-body']")]
    .filter((e) => e.getClientRects().length > 0).map((e) => e.innerText)"""

def answered(page, message: str) -> None:
    """Until the panel says `message`, or Gradio shows an error (then the asserts say which)."""
    page.wait_for_function(f"""document.querySelector('#score-summary').innerText.includes({message!r})
        || ({SHOWN_ERRORS_JS})().length > 0""")


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_a_refusal_is_a_line_in_the_panel_and_the_text_stays(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, "prompt=The%20quick&seed=1&max_new_tokens=3")
    page.get_by_text("Probability of a text: how likely").click()
    box = page.locator("#score-text textarea")
    cases = [("#score-prompt", EXAMPLE, "Generate first: this scores the prompt of the run."),
             ("#score", "", "the text is empty"),
             ("#score", LONG, "the text is 40,000 characters but the context window is 256")]
    for button, text, message in cases:
        if button == "#score":
            box.fill(text)
        page.click(button)
        answered(page, message)
        assert page.evaluate(SHOWN_ERRORS_JS) == []
        summary = page.inner_text("#score-summary")
        assert message in summary and "\n" not in summary.strip()
        assert box.input_value() == text and box.is_visible()
        assert page.locator("#score-view .tl-t").count() == 0  # nothing scored is shown
        page.locator("#score-summary").scroll_into_view_if_needed()
        shot(page, f"score-{'prompt' if button == '#score-prompt' else len(text)}-{width}")
    page.close()
