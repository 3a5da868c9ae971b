"""The page audit's defects seen in the browser (the handlers' checks are in
test_audit_handlers.py): chromium at 1400 and 420 px wide, screenshots in /tmp/shots/fix-page-audit/."""

from pathlib import Path

import pytest

from browser import open_at
from engine_hold import fail_mid_run
from inference.errors import InputError
from tiny_models import offered, without_chat_template

SHOTS = Path("/tmp/shots/fix-page-audit")
SIZES = [(1400, 1000), (420, 900)]


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


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


@pytest.fixture(scope="module")
def two_models_app(tiny_dirs, tmp_path_factory):
    """The real page offering "mha" (the default), "plain" (gqa_tied without a chat template) and
    "gqa_tied", served on a free localhost port; and its Models."""
    from ui.handlers import Handlers
    from ui.layout import build_ui, launch
    plain = without_chat_template(tiny_dirs["gqa_tied"], tmp_path_factory.mktemp("plain") / "plain")
    models = offered({"mha": tiny_dirs["mha"], "plain": plain, "gqa_tied": tiny_dirs["gqa_tied"]})
    engine = models.engine()
    demo = build_ui(engine, Handlers(engine, models=models))
    _, url, _ = launch(demo, engine, port=None, block=False)
    yield url.rstrip("/"), models
    demo.close()
    models.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_picking_a_model_updates_the_kv_formula_mode_and_a_not_started_status(two_models_app, browser,
                                                                               width, height):
    """A link to "plain" in chat mode opens in completion mode, chat not offered (its note says
    why); a setting it cannot run is refused in the status line. Picking "mha" offers chat
    again, clears the refusal, and the KV-cache formula shows mha's numbers (4 KV heads) where
    it showed plain's (2)."""
    page = open_at(browser, two_models_app[0], width, height,
                   "prompt=Hello&model=plain&mode=chat&max_new_tokens=4&logit_bias=999999:5")
    page.wait_for_function("document.querySelector('#kv-formula').innerText.includes('2 × 2 × 2 × 16 × 4')")
    page.wait_for_function("document.querySelector('#mode input[value=chat]').disabled && "
                           "document.querySelector('#mode input[value=completion]').checked")
    assert "no chat template" in page.locator("#mode").inner_text()
    page.click("#generate")
    page.wait_for_function("document.querySelector('#status').innerText.includes('names token 999999')")
    page.locator("#status").scroll_into_view_if_needed()
    shot(page, f"model-refused-{width}")
    page.locator("#model input").click()
    page.get_by_role("option", name="mha").click()
    page.wait_for_function("document.querySelector('#kv-formula').innerText.includes('2 × 2 × 4 × 16 × 4')")
    page.wait_for_function("document.querySelector('#status').innerText.trim() === ''")
    page.wait_for_function("!document.querySelector('#mode input[value=chat]').disabled")
    assert "2 × 2 × 2 × 16" not in page.locator("#kv-formula").inner_text()
    page.locator("#model").scroll_into_view_if_needed()
    shot(page, f"model-switched-{width}")
    page.close()


def test_a_model_picked_while_a_run_streams_is_taken(two_models_app, browser, hold):
    """Picking a model is not a second run of the visitor's: while their run streams (held after
    its first tokens) the pick is taken (its card shown), never refused with "You already have a
    run going"; the run ends on the model it started on."""
    url, models = two_models_app
    held = hold(models.engine("mha"))
    page = open_at(browser, url, 1400, 1000, "prompt=Hello&seed=1&max_new_tokens=12")
    page.click("#generate")
    held.step(3)  # the run has made 3 tokens and is held before the 4th
    page.locator("#model input").click()
    page.get_by_role("option", name="gqa_tied").click()
    page.wait_for_function("document.querySelector('#model-card').innerText.includes('gqa_tied')")
    assert page.locator(".toast-message-text", has_text="already have a run").count() == 0
    held.open()
    page.wait_for_function("document.querySelector('#stats').innerText.includes('Run ended')")
    assert "12 tokens" in page.locator("#status").inner_text()
    page.close()
