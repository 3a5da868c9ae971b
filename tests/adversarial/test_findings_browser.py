"""What issue 59 changed on the page, in chromium at 1400 and 420 px (screenshots under
test-results/shots/test_findings_browser/): a beam search that finishes no beam says why in the
decoding summary, a constraint's error says where without quoting the text, and with logins the
page before login is its login form, its copy of the API's description left out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from browser import open_at, open_page, shot, wait_text

SIZES = [(1400, 1000), (420, 900)]
LOGINS = [("ann", "apple-pie")]


@pytest.fixture(scope="module")
def login_page(tiny_dirs):
    from app import serve
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from ui.layout import build_ui

    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    demo = build_ui(engine, Handlers(engine))
    _, url, _ = serve(demo, engine, block=False, auth=LOGINS)
    yield SimpleNamespace(url=url.rstrip("/"))
    demo.close()
    engine.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_a_beam_search_that_finishes_no_beam_says_why(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height,
                   "prompt=The%20quick%20brown&max_new_tokens=60&num_beams=4&length_penalty=-5&temperature=0")
    page.get_by_text("Decoding: beam search and speculative decoding").click()
    page.click("#beam-search")
    wait_text(page, "#decoding-summary", "finished no beam")
    said = page.inner_text("#decoding-summary")
    assert "length penalty -5" in said and "nearer 0" in said
    assert page.locator("#open-beam").is_disabled()
    shot(page, f"unscored-beams-{width}", selector="#decoding-summary")


@pytest.mark.parametrize("width,height", SIZES)
def test_a_constraint_error_says_where_not_what(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, "constraint=grammar&constraint_text=root%20%3A%3A%3D%20hunter2_rule")
    wait_text(page, "#constraint-check", "is not a valid grammar")
    said = page.inner_text("#constraint-check")
    assert "hunter2" not in said and "line 1, column" in said
    shot(page, f"constraint-error-{width}", selector="#constraint-check")


@pytest.mark.parametrize("width,height", SIZES)
def test_before_login_the_page_is_its_login_form(login_page, browser, width, height):
    page = open_page(browser, viewport={"width": width, "height": height})
    page.goto(login_page.url + "/")
    page.wait_for_selector("input[type=password]")
    assert page.evaluate("window.gradio_api_info") is None
    assert page.locator("#beam-search").count() == 0 and page.locator("#model-card").count() == 0
    shot(page, f"login-form-{width}")
    page.fill("input[type=text]", LOGINS[0][0])
    page.fill("input[type=password]", LOGINS[0][1])
    page.get_by_role("button", name="Login").click()
    page.wait_for_selector("#model-card")  # logged in: the page itself, and its copy of the API's description
    assert page.evaluate("window.gradio_api_info") is not None
