"""The page's layout in chromium at 1400×1000 and 420×900: wide tables say that they scroll and
keep their row names in view, chart titles are whole, the bars' headers and the sliders' labels
are readable, and no untranslated key is read out. Screenshots go to
test-results/shots/test_layout_browser/."""

import re

import pytest

from browser import SIZES, generate_to_end, open_at, open_page, set_slider, shot, wait_loaded, wait_text

QUERY = "prompt=The%20quick%20brown&temperature=0.8&seed=3&max_new_tokens=10"

# Every table on the page: the box it scrolls in (itself or a wrapper), whether more of it lies
# to the right, and whether a hint above that box says so, visibly.
TABLES_JS = """() => [...document.querySelectorAll('table')].filter(t => t.getClientRects().length).map(t => {
  let box = null;
  for (let e = t, i = 0; e && i < 4 && !box; e = e.parentElement, i++)
    if (/(auto|scroll)/.test(getComputedStyle(e).overflowX)) box = e;
  const b = (box || t).getBoundingClientRect(), hint = box && box.previousElementSibling;
  return {where: t.closest('.block')?.id, head: t.rows[0]?.innerText.replace(/\\s+/g, ' ').slice(0, 40),
          right: Math.min(t.getBoundingClientRect().right, b.right), width: innerWidth,
          hidden: box ? box.scrollWidth - box.clientWidth : 0, more: box?.dataset.tlMore || '',
          boxWidth: box ? box.clientWidth : 0,
          hint: hint?.classList.contains('tl-scroll-hint') && hint.checkVisibility() ? hint.innerText : ''};
})"""

def ran(browser, live_app, width: int, height: int):
    """The page at this size with QUERY's settings, after a run to its end."""
    page = open_at(browser, live_app[0], width, height, QUERY)
    generate_to_end(page)
    return page


def tables_say_they_scroll(page) -> list[dict]:
    """Every table inside the window; one cut by its box is marked and hinted, one that is not
    has neither."""
    page.wait_for_timeout(100)  # the marks follow the DOM within a frame (scroll.js)
    tables = page.evaluate(TABLES_JS)
    for t in tables:
        assert t["right"] <= t["width"] + 1, t  # what shows of it lies inside the window
        if t["hidden"] > 3:  # faded; in words only where much is hidden (not for a sliver)
            assert "right" in t["more"], t
            assert ("scroll sideways" in t["hint"]) == (t["hidden"] > max(40, 0.1 * t["boxWidth"])), t
        else:
            assert not t["more"] and not t["hint"], t
    return tables


def headers_apart(page, selector: str) -> None:
    """The bars' two column headers: whole (nothing cut) and apart (their texts 8 px or more
    apart: at 420 px "raw model probability final (sampled from)" read as one phrase)."""
    for bars in page.locator(selector).all():
        boxes = bars.evaluate("""b => [...b.querySelectorAll('.tl-head .tl-h2')].map(h => {
            const r = document.createRange(); r.selectNodeContents(h);
            const lines = [...r.getClientRects()];
            return {cut: h.scrollWidth > h.clientWidth + 1 || h.scrollHeight > h.clientHeight + 1,
                    left: Math.min(...lines.map(l => l.left)), right: Math.max(...lines.map(l => l.right))}; })""")
        assert len(boxes) == 2 and not boxes[0]["cut"] and not boxes[1]["cut"], boxes
        assert boxes[0]["right"] + 8 <= boxes[1]["left"], boxes


@pytest.mark.parametrize("width,height", SIZES)
def test_bars_headers_and_the_step_sliders_ends(live_app, browser, width, height):
    page = ran(browser, live_app, width, height)
    headers_apart(page, "#topk .tl-bars")
    shot(page, f"bars-{width}", selector="#topk")
    page.wait_for_function("document.querySelector('#step input[type=number]').max === '9'")
    ends = page.evaluate("""[...document.querySelectorAll('#step :is(.min_value, .max_value)')]
                            .map(e => e.checkVisibility() ? e.innerText : null)""")
    page.close()
    assert ends == ["0", "9"]  # gradio hides them below 480 px


CHART_HEIGHTS_JS = """[...document.querySelectorAll('.vega-embed svg')].filter(s => s.getClientRects().length)
    .map(s => ({id: s.closest('.block').id, height: Math.round(s.getBoundingClientRect().height)}))"""


@pytest.mark.parametrize("width,height", SIZES)
def test_charts_are_drawn_once_they_have_data_at_their_height(live_app, browser, width, height):
    """Before any run the charts are not drawn (Gradio's empty placeholder: an empty Vega chart
    warned "Infinite extent" at every update and kept an empty colour scale); after a
    run each is drawn at its size, axes and titles readable (an empty untyped column once made
    Vega-Lite draw them 0 px high)."""
    page = open_at(browser, live_app[0], width, height, QUERY)
    page.get_by_text("Sampling experiments").click()
    page.wait_for_timeout(300)  # the accordion's charts mount
    assert page.evaluate(CHART_HEIGHTS_JS) == []
    shot(page, f"empty-charts-{width}", selector="#kv-chart")
    generate_to_end(page)
    page.wait_for_selector("#rank-chart svg .role-title-text")
    page.wait_for_timeout(300)
    after = {c["id"]: c["height"] for c in page.evaluate(CHART_HEIGHTS_JS)}
    shot(page, f"charts-after-a-run-{width}", selector="#kv-chart")
    page.close()
    assert {"kv-chart", "latency-chart", "run-chart", "entropy-chart", "rank-chart"} <= set(after)
    assert all(h >= 200 for h in after.values()), after


@pytest.mark.parametrize("width,height", SIZES)
def test_experiments_chart_titles_whole_and_tables_say_they_scroll(live_app, browser, width, height):
    page = ran(browser, live_app, width, height)
    page.get_by_text("Sampling experiments").click()
    page.wait_for_selector("#rank-chart svg .role-title-text")
    page.wait_for_timeout(300)  # the charts' layout settles after the accordion opens
    titles = page.evaluate("""[...document.querySelectorAll('.vega-embed svg')].filter(s => s.getClientRects().length)
        .map(s => { const t = s.querySelector('.role-title-text'), a = s.getBoundingClientRect(),
                          c = s.closest('.block').getBoundingClientRect(), r = t.getBoundingClientRect();
                    return {title: t.textContent, id: s.closest('.block').id,
                            inside: r.left >= Math.max(a.left, c.left) - 1 && r.right <= Math.min(a.right, c.right) + 1}; })""")
    ids = {t["id"] for t in titles}
    assert {"run-chart", "entropy-chart", "rank-chart", "kv-chart"} <= ids, titles
    assert all(t["inside"] for t in titles), titles
    shot(page, f"charts-{width}", selector="#run-chart")
    page.click("#replay")
    page.wait_for_selector("#replay-stages table")
    set_slider(page, "#b-temperature", 0.2, key="Tab")
    page.click("#compare")
    wait_text(page, "#compare-summary", "perplexity")
    page.wait_for_selector("#compare-bars-b .tl-bars")
    page.fill("#likely-text textarea", " fox jumps over")
    page.click("#likely")
    page.wait_for_selector("#likely-table table")
    tables = tables_say_they_scroll(page)
    assert {"replay-stages", "compare-summary", "likely-table"} <= {t["where"] for t in tables}
    headers_apart(page, "#compare-bars .tl-bars")
    shot(page, f"compare-{width}", selector="#compare-summary")
    page.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_inside_and_samples_tables_say_they_scroll_and_keep_row_names(live_app, browser, width, height):
    page = ran(browser, live_app, width, height)
    page.get_by_text("Many samples: draw N").click()
    set_slider(page, "#n-samples", 8)
    page.click("#samples")
    wait_text(page, "#samples-first", "Chi-square")
    page.get_by_text("Inside one token").click()
    page.click("#inspect")
    page.wait_for_selector("#stages table")
    page.wait_for_selector("#attention .tl-att table")
    tables = tables_say_they_scroll(page)
    assert {"stages", "memory", "attention"} <= {t["where"] for t in tables}
    stages = next(t for t in tables if t["where"] == "stages")
    if width == 420:  # the stage table is far wider than a phone: it says so, and scrolls
        assert stages["hidden"] > 100 and stages["more"] == "right"
        page.locator("#stages table").scroll_into_view_if_needed()
        shot(page, f"inside-{width}")
        page.evaluate("(b => b.scrollLeft = b.scrollWidth)(document.querySelector('#stages table'))")
        page.wait_for_function("document.querySelector('#stages table').dataset.tlMore === 'left'")
        # Scrolled to its end: the stage names are still in view, flush with the box's left edge
        # (no strip beside them where the scrolled columns show through).
        name = page.evaluate("""(() => { const b = document.querySelector('#stages table'), c = b.rows[3].cells[0];
            const r = c.getBoundingClientRect(), a = b.getBoundingClientRect();
            return {gap: r.left - a.left - b.clientLeft, right: r.right <= a.right, width: r.width}; })()""")
        assert abs(name["gap"]) <= 1 and name["right"] and name["width"] > 40, name
        hint = page.locator("#stages .tl-scroll-hint")
        assert hint.is_visible() and "scroll back" in hint.inner_text()
        shot(page, f"inside-scrolled-{width}")
    else:
        assert stages["hidden"] <= 3  # a wide screen shows it whole, without a hint
        page.locator("#stages").scroll_into_view_if_needed()
        shot(page, f"inside-{width}")
    shot(page, f"samples-{width}", selector="#samples-outcomes")
    page.close()


def test_b_settings_labels_keep_their_words_whole(live_app, browser):
    url, _, _ = live_app
    page = open_at(browser, url, 1400, 1000, "prompt=Hi")
    page.get_by_text("Sampling experiments").click()
    page.get_by_text("More B settings").click()
    page.wait_for_selector("#b-min-p [data-testid=block-info]")
    # A label whose text fits its block's width takes one line (gradio's flex let "B Min-p"
    # shrink to its longest word and break as "B / Min- / p").
    labels = page.evaluate("""[...document.querySelectorAll('#b-more .block:has(input[type=range]) [data-testid=block-info]')]
        .map(e => { const style = getComputedStyle(e), lines = Math.round(e.getBoundingClientRect().height
                          / parseFloat(style.lineHeight));
                    const probe = e.cloneNode(true); probe.style.cssText = 'position:absolute;white-space:nowrap;width:max-content';
                    document.body.appendChild(probe); const needed = probe.getBoundingClientRect().width; probe.remove();
                    const room = e.closest('.head').getBoundingClientRect().width;
                    return {text: e.innerText, lines, fits: needed <= room}; })""")
    assert len(labels) >= 15 and any(x["text"] == "B Min-p" for x in labels), labels
    assert all(x["lines"] == 1 for x in labels if x["fits"]), [x for x in labels if x["fits"] and x["lines"] != 1]
    shot(page, "b-settings-1400", selector="#b-more")
    page.close()


def test_no_untranslated_key_is_read_out(live_app, browser):
    """Gradio's status tracker reads out "common.complete" when an event with a progress
    indicator ends, a key its English messages lack; the page supplies the words."""
    url, _, _ = live_app
    page = open_page(browser, viewport={"width": 1400, "height": 1000})
    page.add_init_script("""document.addEventListener('DOMContentLoaded', () => {
        window.__said = [];
        new MutationObserver(() => document.querySelectorAll('[aria-live]').forEach(e => {
            if (e.textContent.trim()) window.__said.push(e.textContent.trim()); }))
          .observe(document.body, {subtree: true, childList: true, characterData: true}); })""")
    page.goto(url + "/?" + QUERY)
    wait_loaded(page)
    generate_to_end(page)
    page.get_by_text("Inside one token").click()
    page.click("#inspect")  # an event with gradio's progress indicator: its end is announced
    page.wait_for_selector("#stages table")
    page.wait_for_function("window.__said.includes('Done')")
    said = page.evaluate("window.__said")
    assert not [s for s in said if s.startswith("common.")], said
    page.close()


def test_the_run_charts_tooltip_reads_the_number_the_text_shows(live_app, browser):
    """Hovering the per-step chart shows the chosen token's probability as the token's popover
    prints it (Vega-Lite's tooltip printed ten digits: 0.3899998069 beside the text's 0.3900)."""
    page = ran(browser, live_app, 1400, 1000)
    shown = {int(m[0]): float(m[1]) for m in (page.evaluate(
        """[...document.querySelectorAll('#output .tl-pop-head')].map(h =>
             [(h.textContent.match(/^step (\\d+) ·/) || [])[1], h.querySelector('.tl-p').textContent])""")) if m[0]}
    page.get_by_text("Sampling experiments").click()
    page.wait_for_selector("#run-chart svg .role-title-text")
    tips = {}
    for _ in range(20):  # sweeps until Vega, busy laying out the opened accordion, shows tooltips
        page.wait_for_timeout(300)
        box = page.locator("#run-chart svg").first.bounding_box()
        for i in range(80):  # a sweep across the plot: the nearest step's point shows its tooltip
            page.mouse.move(box["x"] + box["width"] * (0.05 + 0.9 * i / 80), box["y"] + box["height"] * 0.5)
            text = page.evaluate("(document.querySelector('#vg-tooltip-element.visible') || {}).innerText || ''")
            step, p = (re.search(rf"{key}\s+([-\d.e]+)", text) for key in ("step", "probability"))
            if step and p:
                tips[int(step[1])] = p[1]
        if len(tips) >= 3:
            break
    page.close()
    assert len(tips) >= 3 and len(shown) >= 3, (tips, shown)
    for step, p in tips.items():
        assert float(p) == shown[step] and len(p.split(".")[-1]) <= 4, (step, p, shown[step])
