"""Byte tokens in chromium at 1400 and 420 px: the bars label each <0xNN> candidate with which
bytes of a character it is, and no byte token's label is cut at either width. Screenshots under
test-results/shots/test_byte_tokens_browser/."""

import pytest

from browser import open_at, run_to_end, shot

QUERY = "prompt=%E4%BB%8A%E5%A4%A9%E5%A4%A9%E6%B0%94&temperature=0&seed=1&max_new_tokens=6"

CUT_JS = """() => [...document.querySelectorAll('#topk .tl-tok-bytes')]
    .filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.innerText)"""


ROW_HEIGHTS_JS = """() => {
    const rows = [...document.querySelectorAll('#topk .tl-row:not(.tl-head)')];
    const h = (r) => r.getBoundingClientRect().height;
    return {hinted: rows.filter((r) => r.querySelector('.tl-byte-hint')).map(h),
            plain: rows.filter((r) => !r.querySelector('.tl-byte-hint')).map(h)};
}"""


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_byte_candidates_are_labelled_and_never_cut(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, QUERY)
    run_to_end(page, lambda: page.click("#generate"))
    labelled = page.locator("#topk .tl-tok-bytes")
    assert labelled.count() > 0  # the tiny model's candidates hold byte tokens
    hints = page.locator("#topk .tl-tok-bytes .tl-byte-hint").all_inner_texts()
    assert hints and all(h.endswith(" bytes") or h in ("continues a character", "not UTF-8") for h in hints)
    assert page.evaluate(CUT_JS) == []
    if width == 1400:  # a hinted row is as tall as any other: byte-heavy steps keep the bars in view
        heights = page.evaluate(ROW_HEIGHTS_JS)
        assert heights["hinted"] and max(heights["hinted"]) <= min(heights["plain"]) + 1, heights
    shot(page, f"bars-{width}", selector="#topk")
    page.close()
