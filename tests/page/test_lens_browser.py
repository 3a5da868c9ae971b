"""The quantization lens in chromium at 1400 and 420 px: precisions picked, the table, the three
charts per step with the fork marked, both texts where they fork, nothing wider than the window,
and a term's definition on a tap. Screenshots go to test-results/shots/test_lens_browser/."""

import pytest

from browser import open_at, overflows, set_slider, shot, wait_text


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_the_lens_draws_each_precision_per_step_and_where_it_forks(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, "")
    page.get_by_text("Quantization lens: the model at several precisions").click()
    # The section's own prompt: on the tiny model both 4-bit precisions fork from float32's text.
    page.get_by_label("Q8_0", exact=True).uncheck()
    page.get_by_label("Q4_1", exact=True).check()  # with Q4_0, checked already: two precisions beside float32
    set_slider(page, "#lens-tokens", 8)
    page.click("#lens-run")
    page.wait_for_selector("#lens-table")
    wait_text(page, "#lens-summary", "Quantization lens")
    rows = page.locator("#lens-table tr[data-precision]")
    assert [rows.nth(i).get_attribute("data-precision") for i in range(rows.count())] == ["float32", "q4_1", "q4_0"]
    assert page.locator("#lens-kl polyline").count() == 2 and page.locator("#lens-rank polyline").count() == 2
    assert page.locator("#lens-agree rect").count() > 8
    forks = page.locator(".tl-qlens-fork").count()
    assert forks >= 1 and forks == page.locator("#lens-kl .tl-fork").count()  # each fork marked, its texts given
    assert page.locator(".tl-qlens-fork mark").count() == 2 * forks  # float32's text and its own, from the fork
    for chart in ("#lens-kl", "#lens-rank", "#lens-agree"):
        b = page.locator(chart).bounding_box()
        assert b["width"] > 250 and b["x"] >= 0 and b["x"] + b["width"] <= width, (chart, b)
    assert not overflows(page)
    page.locator("#lens-summary").scroll_into_view_if_needed()
    shot(page, f"lens-summary-{width}")
    page.locator("#lens-kl").scroll_into_view_if_needed()
    shot(page, f"lens-charts-{width}")
    page.locator(".tl-qlens-fork").first.scroll_into_view_if_needed()
    shot(page, f"lens-forks-{width}")
    # A term of the table explained on a tap (the glossary's tooltip).
    term = page.locator("#lens-table .tl-term[data-term='fork step']").first
    term.scroll_into_view_if_needed()
    term.click()
    page.wait_for_function("[...document.querySelectorAll('.tl-tip, [role=tooltip]')].some("
                           "(t) => t.innerText.includes('greedy text writes another token'))")
    shot(page, f"lens-term-{width}")
    page.close()


@pytest.fixture(scope="module")
def shared_page(tiny_engine):
    """The page on the tiny model with a shared page's limits (2 precisions a visitor's lens)."""
    from app import serve
    from server.limits import Limits
    from ui.handlers import Handlers
    from ui.layout import build_ui
    demo = build_ui(tiny_engine, Handlers(tiny_engine, limits=Limits.shared()))
    _, url, _ = serve(demo, tiny_engine, port=None, block=False)
    yield url.rstrip("/")
    demo.close()


def test_a_shared_pages_bound_is_said_where_it_is_picked_and_when_it_refuses(shared_page, browser):
    page = open_at(browser, shared_page, 420, 900, "")
    page.get_by_text("Quantization lens: the model at several precisions").click()
    wait_text(page, "#lens-precisions", "at most 2 on this server")
    for name in ("Q5_0", "Q4_1"):
        page.get_by_label(name, exact=True).check()
    page.click("#lens-run")
    wait_text(page, "#lens-summary", "at most 2 precisions besides float32 per visitor")
    assert "4 were picked" in page.inner_text("#lens-summary") and page.locator("#lens-table").count() == 0
    assert not overflows(page)
    shot(page, "lens-refused-420", selector="#lens-summary")
    page.close()
