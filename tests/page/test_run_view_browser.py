"""The run's view in chromium at 1400×1000 and 420×900 (element boxes, the DOM, computed styles):
the output and its bars in view together during a run, the temperature-0 popover showing raw and
final and colouring by raw, the KV chart and the generated tokens' box (the handlers' checks are
in test_run_view_handlers.py). Screenshots go to test-results/shots/test_run_view_browser/."""

import pytest

from browser import SIZES, box, generate_to_end, open_at, overflows, shot

@pytest.mark.parametrize("width,height", SIZES)
def test_output_and_bars_in_view_together_during_a_run(live_app, browser, hold, width, height):
    url, engine, _ = live_app
    held = hold(engine)
    page = open_at(browser, url, width, height, "prompt=Once%20upon%20a%20time&seed=3&max_new_tokens=60")
    page.click("#generate")
    held.step(30)  # held mid-run, after 30 tokens
    page.wait_for_function("document.querySelectorAll('#output .tl-t').length >= 25")
    page.wait_for_selector("#topk .tl-chosen")
    if width == 1400:
        # Scrolled to the output's caption (the page's header above it is not part of the promise):
        # the whole output box and the whole of its bars inside the window, at once.
        page.evaluate("document.querySelector('#output-caption').scrollIntoView({block: 'start'})")
        out, bars = box(page, "#output .tl-out"), box(page, "#topk .tl-bars")
        assert 0 <= out["y"] and out["y"] + out["height"] <= height, out
        assert 0 <= bars["y"] and bars["y"] + bars["height"] <= height, bars
        # And so when the output has grown to its tallest (it scrolls inside beyond that).
        tallest = page.evaluate("parseFloat(getComputedStyle(document.querySelector('#output .tl-out')).maxHeight)")
        assert out["y"] + tallest + (bars["y"] + bars["height"] - out["y"] - out["height"]) <= height, tallest
    else:
        assert box(page, "#output")["y"] < box(page, "#topk")["y"] < box(page, "#settings")["y"]
        page.locator("#output").scroll_into_view_if_needed()
    assert not overflows(page)
    shot(page, f"run-mid-{width}")
    held.open()
    page.wait_for_function("document.querySelector('#stats').innerText.includes('Run ended')")
    shot(page, f"run-after-{width}")
    page.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_temperature_zero_popover_shows_raw_and_final_and_colours_by_raw(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, "prompt=The%20quick&temperature=0&seed=5&max_new_tokens=8")
    generate_to_end(page)
    tok = page.locator("#output .tl-t").nth(1)
    tok.scroll_into_view_if_needed()
    tok.hover()
    pop = tok.locator(".tl-pop")
    assert pop.is_visible()
    # Whole in the window: its head wraps rather than running past the box (cut at 420 px).
    assert pop.evaluate("""p => { const h = p.querySelector('.tl-pop-head'), r = p.getBoundingClientRect();
                                  return h.scrollWidth <= h.clientWidth + 1 && r.left >= 0 && r.right <= innerWidth; }""")
    rows = pop.locator(".tl-pop-cols, .tl-alt").all_inner_texts()
    assert rows[0].split() == ["token", "raw", "final"]
    raws = [float(r.split()[-2]) for r in rows[1:]]
    assert sum(raws) > 0 and any(0 < r < 1 for r in raws)  # not every alternative 0.0000
    shot(page, f"popover-{width}")
    page.mouse.move(0, 0)
    tok.focus()  # a tapped token keeps its popover open; Escape closes it
    assert pop.is_visible()
    page.keyboard.press("Escape")
    assert not pop.is_visible()
    colour = "getComputedStyle(document.querySelectorAll('#output .tl-t')[1]).backgroundColor"
    final_colour = page.evaluate(colour)
    raw_class = tok.get_attribute("class").split()[-1]  # tl-rb0 … tl-rb3
    page.get_by_text("colour by raw p").click()
    page.wait_for_function("document.body.classList.contains('tl-colour-raw')")
    expected = page.evaluate(f"getComputedStyle(document.querySelector('.tl-legend .tl-b{raw_class[-1]}'))"
                             ".backgroundColor")
    assert page.evaluate(colour) == expected
    assert page.locator(".tl-by-raw").first.is_visible() and not page.locator(".tl-by-final").first.is_visible()
    if raw_class != "tl-rb0":
        assert expected != final_colour
    page.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_kv_chart_and_generated_tokens_box(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, "prompt=Once%20upon%20a%20time&seed=3&max_new_tokens=120")
    generate_to_end(page)
    chips = page.locator(".tl-gen-tokens .tl-chips")
    chips.scroll_into_view_if_needed()
    # Nothing of the generated tokens hidden in a box without a visible way to scroll.
    if width == 420:
        assert page.evaluate("(e => e.scrollHeight <= e.clientHeight + 1)(document.querySelector("
                             "'.tl-gen-tokens .tl-chips'))")
    shot(page, f"tokens-{width}")
    page.locator("#kv-chart").scroll_into_view_if_needed()
    page.wait_for_timeout(500)  # the chart's drawing: for the screenshot only
    assert page.locator("#kv-chart canvas, #kv-chart svg").count() >= 1  # its series: the handler test
    assert page.evaluate("document.documentElement.scrollHeight") < 20000  # no chart drawn endlessly tall
    assert "MiB" in page.inner_text("#kv-formula") and " MB" not in page.inner_text("#kv-formula")
    shot(page, f"kv-{width}")
    page.close()
