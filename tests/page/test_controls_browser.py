"""The controls in chromium at 1400×1000 and 420×900: a temperature typed beyond its range is said,
and bad fields are said under them, each named by its label (the handlers' checks are in
test_controls_handlers.py). Screenshots go to test-results/shots/test_controls_browser/."""

import pytest

from browser import SIZES, open_at, overflows, shot
from inference.sampling.settings import BY_NAME

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
