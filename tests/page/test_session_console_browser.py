"""A scripted session of the page's main paths in chromium, at 1400 and 420
px: the default first run, a reload, a link, a branch, an edit and continue, the experiments'
charts, many samples and the probability of a text. It leaves no console error, no page error,
no Vega "Infinite extent" warning (an empty chart's) and no HTTP response of 400 or more; the
charts' lines have their colours. Screenshots under test-results/shots/test_session_console_browser/.

The same session runs against a page served elsewhere, on real models (scripts/page_session.sh):
TOKENLAB_SESSION_URL=http://HOST:PORT and TOKENLAB_SESSION_MODELS=default,gemma3-270m (each
model's session opens with ?model=NAME)."""

from urllib.parse import quote

import pytest

from browser import SESSION_MODELS, SIZES, open_page, run_to_end, shot, wait_loaded, wait_text, watch


# The strokes of the KV chart's lines.
LINES_JS = "[...document.querySelectorAll('#kv-chart g.mark-line path')].map((p) => p.getAttribute('stroke'))"


def open_panel(page, title: str) -> None:
    page.get_by_text(title).first.click()


@pytest.mark.slow  # a whole session of the page, twice
@pytest.mark.parametrize("model", SESSION_MODELS)
@pytest.mark.parametrize("width,height", SIZES)
def test_a_session_leaves_no_console_error_and_no_failed_request(served, browser, width, height, model):
    url, pick = served.rstrip("/"), f"&model={quote(model)}" if model else ""
    name = f"{model}-{width}" if model else f"{width}"
    page = open_page(browser, viewport={"width": width, "height": height})
    seen = watch(page)
    page.goto(url + "/?" + pick.lstrip("&"))
    wait_loaded(page)
    shot(page, f"first-{name}")
    page.fill("#seed input, #seed textarea", "3")
    run_to_end(page, lambda: page.click("#generate"))  # the default: a chat turn
    shot(page, f"after-generate-{name}")
    # The KV chart, first drawn with its data, has a colour for each of its lines (a
    # chart first drawn empty kept an empty colour scale, its lines without a stroke).
    page.wait_for_function(f"{LINES_JS}.length >= 2")
    assert all(page.evaluate(LINES_JS)), page.evaluate(LINES_JS)
    page.reload()
    wait_loaded(page)
    page.goto(url + "/?prompt=Once+upon+a+time&mode=completion&max_new_tokens=6&seed=3&temperature=0.8" + pick)
    wait_loaded(page)
    run_to_end(page, lambda: page.click("#generate"))
    run_to_end(page, lambda: page.locator("#topk .tl-row.tl-pick:not(.tl-chosen)").first.click())  # a branch
    open_panel(page, "Edit the output and continue")
    page.locator("#edit-text textarea").fill("Once more")
    run_to_end(page, lambda: page.click("#edit-continue"))
    page.wait_for_function("document.querySelectorAll('#branches .tl-branch').length === 3")
    open_panel(page, "Sampling experiments: the pipeline of a step")
    page.click("#replay")
    page.wait_for_function("(document.querySelector('#replay-stages')?.innerText || '').includes('Step')")
    open_panel(page, "Many samples: draw N")
    page.click("#samples")
    wait_text(page, "#samples-first", "First step")
    open_panel(page, "Probability of a text: how likely")
    page.click("#score")
    page.wait_for_selector("#score-view .tl-t")
    open_panel(page, "Inside one token: the path")
    page.click("#inspect")
    page.wait_for_function("(document.querySelector('#stages')?.innerText || '').includes('Prefill')")
    shot(page, f"end-{name}", full=True)
    page.close()
    infinite = [w for w in seen["warnings"] if "Infinite extent" in w]
    assert seen["errors"] == [] and seen["http"] == [] and infinite == [], seen
