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
    """The real page offering "mha" (the default) and "plain" (gqa_tied without a chat
    template), served on a free localhost port."""
    from ui.handlers import Handlers
    from ui.layout import build_ui, launch
    plain = without_chat_template(tiny_dirs["gqa_tied"], tmp_path_factory.mktemp("plain") / "plain")
    models = offered({"mha": tiny_dirs["mha"], "plain": plain})
    engine = models.engine()
    demo = build_ui(engine, Handlers(engine, models=models))
    _, url, _ = launch(demo, engine, port=None, block=False)
    yield url.rstrip("/")
    demo.close()
    models.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_picking_a_model_updates_the_kv_formula_and_clears_a_not_started_status(two_models_app, browser,
                                                                                width, height):
    """Chat mode on "plain" is refused in the status line; picking "mha" clears it, and the
    KV-cache formula shows mha's numbers (4 KV heads) where it showed plain's (2)."""
    page = open_at(browser, two_models_app, width, height, "prompt=Hello&model=plain&mode=chat&max_new_tokens=4")
    page.wait_for_function("document.querySelector('#kv-formula').innerText.includes('2 × 2 × 2 × 16 × 4')")
    page.click("#generate")
    page.wait_for_function("document.querySelector('#status').innerText.includes('no chat template')")
    page.locator("#status").scroll_into_view_if_needed()
    shot(page, f"model-refused-{width}")
    page.locator("#model input").click()
    page.get_by_role("option", name="mha").click()
    page.wait_for_function("document.querySelector('#kv-formula').innerText.includes('2 × 2 × 4 × 16 × 4')")
    page.wait_for_function("document.querySelector('#status').innerText.trim() === ''")
    assert "2 × 2 × 2 × 16" not in page.locator("#kv-formula").inner_text()
    page.locator("#model").scroll_into_view_if_needed()
    shot(page, f"model-switched-{width}")
    page.close()
