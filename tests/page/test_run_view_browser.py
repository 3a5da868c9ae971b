"""Issue 25, item 6: the defects seen in the browser, checked in chromium at 1400×1000 and
420×900 (element boxes, the DOM, computed styles). Screenshots go to /tmp/shots/issue-25c/."""

from pathlib import Path

import pytest

from browser import generate_to_end, open_at, set_slider
from inference.sampling.settings import BY_NAME

SHOTS = Path("/tmp/shots/issue-25c")
SIZES = [(1400, 1000), (420, 900)]


def shot(page, name: str, full: bool = False) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full)


def box(page, selector: str) -> dict:
    return page.locator(selector).first.bounding_box()


def overflows(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth > document.documentElement.clientWidth + 1")


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
        page.evaluate("window.scrollTo(0, 0)")
        out, bars = box(page, "#output .tl-out"), box(page, "#topk .tl-bars")
        # The whole output box and the whole of its bars inside the window, at once.
        assert 0 <= out["y"] and out["y"] + out["height"] <= height, out
        assert 0 <= bars["y"] and bars["y"] + bars["height"] <= height, bars
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
def test_compare_turns_generate_off_and_its_bars_fit(live_app, browser, hold, width, height):
    url, engine, _ = live_app
    page = open_at(browser, url, width, height, "prompt=The%20quick&temperature=0.5&top_p=0.9&seed=5&max_new_tokens=12")
    generate_to_end(page)
    page.get_by_text("Sampling experiments").click()
    # B starts as a copy of the run's settings (set at the run's end, by an event of its own);
    # the label says A is the page's own settings.
    page.wait_for_function("document.querySelector('#b-temperature input[type=number]')?.value === '0.5'")
    page.wait_for_function("document.querySelector('#b-top-p input[type=number]')?.value === '0.9'")
    assert "Sampling settings" in page.inner_text("#compare-label")
    set_slider(page, "#b-temperature", 1.5, key="Tab")
    held = hold(engine)
    page.click("#compare")
    page.wait_for_function("document.querySelector('#generate').disabled && !document.querySelector('#stop').disabled "
                           "&& document.querySelector('#likely').disabled")
    held.open()
    page.wait_for_function("(document.querySelector('#compare-summary')?.innerText || '').includes('perplexity')")
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


def test_typed_temperature_beyond_its_range_is_said(live_app, browser):
    url, _, _ = live_app
    page = open_at(browser, url, 1400, 1000, "prompt=Hi")
    field = page.locator("#temperature input[type=number]")
    field.fill("5")
    field.press("Tab")
    page.wait_for_selector("#temperature .tl-clamped")
    note = page.inner_text("#temperature .tl-clamped")
    assert "Temperature" in note and "5 is above the maximum 2" in note
    assert field.input_value() == "2"
    field.fill("0.7")
    field.press("Tab")
    page.wait_for_selector("#temperature .tl-clamped", state="detached")
    page.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_bad_fields_are_said_under_them_and_all_named_by_their_labels(live_app, browser, width, height):
    url, _, _ = live_app
    top_k = BY_NAME["top_k"]
    page = open_at(browser, url, width, height, "prompt=Hello")
    page.fill("#top-k input", "-3")
    page.wait_for_selector("#top-k .tl-clamped")  # as it is typed
    note = page.inner_text("#top-k .tl-clamped")
    assert note == f"{top_k.label}: -3 is below the minimum {top_k.minimum}: a run refuses it."
    page.fill("#seed textarea", "abc")
    page.click("#generate")
    page.wait_for_function("document.querySelector('#status').innerText.includes('fields cannot be used')")
    status = page.inner_text("#status")
    assert f"{top_k.label} must be in {top_k.range_text()}" in status and "top_k" not in status
    assert "Seed must be a whole number or empty (random), got 'abc'" in status
    assert page.input_value("#top-k input") == "-3"  # nothing moved it
    assert not overflows(page)
    page.locator("#status").scroll_into_view_if_needed()
    shot(page, f"bad-fields-{width}")
    page.locator("#top-k").scroll_into_view_if_needed()
    shot(page, f"top-k-note-{width}")
    page.fill("#top-k input", "2")
    page.wait_for_selector("#top-k .tl-clamped", state="detached")
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
