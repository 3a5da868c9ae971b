"""The model picker in chromium on a page offering several models, at 1400 and 420 px wide: picking
a model updates the KV-cache formula, the mode and a not-started status, and a model picked while
a run streams is taken (the handlers' checks are in test_model_picker_handlers.py). Screenshots
go to test-results/shots/test_model_picker_browser/."""

import pytest

from browser import SIZES, open_at, shot
from tiny_models import offered, without_chat_template

@pytest.fixture(scope="module")
def two_models_app(tiny_dirs, tmp_path_factory):
    """The real page offering "mha" (the default), "plain" (gqa_tied without a chat template) and
    "gqa_tied", served on a free localhost port; and its Models."""
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui
    plain = without_chat_template(tiny_dirs["gqa_tied"], tmp_path_factory.mktemp("plain") / "plain")
    models = offered({"mha": tiny_dirs["mha"], "plain": plain, "gqa_tied": tiny_dirs["gqa_tied"]})
    engine = models.engine()
    demo = build_ui(engine, Handlers(engine, models=models))
    _, url, _ = serve(demo, engine, port=None, block=False)
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
