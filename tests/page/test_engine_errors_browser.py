"""An engine error on the page in chromium at 1400 and 420 px wide: an error mid-run ends the run,
said in one line of the status line (the handlers' checks are in test_engine_errors_handlers.py).
Screenshots go to test-results/shots/test_engine_errors_browser/."""

import pytest

from browser import SIZES, open_at, shot
from engine_hold import fail_mid_run
from inference.errors import InputError

@pytest.mark.parametrize("width,height", SIZES)
def test_an_engine_error_mid_run_ends_the_run_on_the_page(live_app, browser, monkeypatch, width, height):
    """The engine raises after the run's first token: the status line says the error in one
    line and stops counting, Generate is enabled again and Stop disabled."""
    url, engine, _ = live_app
    fail_mid_run(monkeypatch, engine, InputError("the engine failed mid-run (a test's error)"))
    page = open_at(browser, url, width, height, "prompt=Once%20upon%20a%20time&seed=3&max_new_tokens=20")
    page.click("#generate")
    page.wait_for_function("document.querySelector('#status').innerText.includes('failed mid-run')")
    page.wait_for_function("!document.querySelector('#generate').disabled")
    status = page.locator("#status").inner_text().strip()
    assert "the engine failed mid-run (a test's error)" in status and "\n" not in status, status
    assert page.locator("#stop").is_disabled()
    page.wait_for_timeout(1500)  # the chart timer, were it still on, would rewrite the status line
    assert page.locator("#status").inner_text().strip() == status
    page.locator("#status").scroll_into_view_if_needed()
    shot(page, f"engine-error-mid-run-{width}")
    page.close()
