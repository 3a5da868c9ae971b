"""Compare A/B in chromium at 1400×1000 and 420×900: a comparison turns Generate off, B follows the
page's settings and the line above its button says what B changes, and the A/B bars fit the window (the handlers' checks are in
test_compare_handlers.py). Screenshots go to test-results/shots/test_compare_browser/."""

import pytest

from browser import SIZES, box, generate_to_end, open_at, overflows, set_slider, shot, wait_text

@pytest.mark.parametrize("width,height", SIZES)
def test_compare_turns_generate_off_and_its_bars_fit(live_app, browser, hold, width, height):
    url, engine, _ = live_app
    page = open_at(browser, url, width, height, "prompt=The%20quick&temperature=0.5&top_p=0.9&seed=5&max_new_tokens=12")
    generate_to_end(page)
    page.get_by_text("Sampling experiments").click()
    # B follows the page's settings (the link's, then a change); the label says A is the page's own.
    page.wait_for_function("document.querySelector('#b-temperature input[type=number]')?.value === '0.5'")
    page.wait_for_function("document.querySelector('#b-top-p input[type=number]')?.value === '0.9'")
    assert "Sampling settings" in page.inner_text("#compare-label")
    wait_text(page, "#compare-diff", "B is A")
    set_slider(page, "#top-p", 0.8, key="Tab")
    page.wait_for_function("document.querySelector('#b-top-p input[type=number]')?.value === '0.8'")
    set_slider(page, "#b-temperature", 1.5, key="Tab")
    wait_text(page, "#compare-diff", "B differs from A in 1 setting")
    assert "Temperature: 0.5 → 1.5" in page.inner_text("#compare-diff")
    held = hold(engine)
    page.click("#compare")
    page.wait_for_function("document.querySelector('#generate').disabled && !document.querySelector('#stop').disabled "
                           "&& document.querySelector('#likely').disabled")
    held.open()
    # The summary's last value, once gradio's "processing" line over it (the event still open) is gone.
    page.wait_for_function("(document.querySelector('#compare-summary')?.innerText || '').includes('perplexity') && "
                           "!document.querySelector('#compare-summary').innerText.startsWith('processing')")
    assert page.inner_text("#compare-summary").startswith("B differs from A in 1 setting: Temperature: 0.5 → 1.5.")
    page.wait_for_function("!document.querySelector('#generate').disabled && document.querySelector('#stop').disabled "
                           "&& !document.querySelector('#likely').disabled")
    page.wait_for_selector("#compare-bars-a .tl-bars")
    a, b = box(page, "#compare-bars-a"), box(page, "#compare-bars-b")
    if width == 420:  # stacked, each the column's width: no sideways scrolling
        assert b["y"] >= a["y"] + a["height"] - 1 and a["width"] > 300
        scrolls = page.evaluate("[...document.querySelectorAll('#compare-bars .tl-bars')]"
                                ".map(e => e.scrollWidth > e.clientWidth + 1)")
        assert scrolls == [False, False]
    assert not overflows(page)
    page.locator("#compare-summary").scroll_into_view_if_needed()
    shot(page, f"compare-{width}")
    page.locator("#compare-bars").scroll_into_view_if_needed()
    shot(page, f"compare-bars-{width}")
    page.close()
