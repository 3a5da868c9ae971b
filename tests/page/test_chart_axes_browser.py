"""The run's charts take their data's extent: each y axis's labels reach its data's largest value
(the KV-cache chart's axis ended at 3.5 MiB while its line reached 3.52: a set axis start turned
Vega-Lite's rounding-out to the next tick off, and the line ran above the last label, along the
top edge). Read from the charts' SVG: the y axis's labels, and each point's value from its
aria-label. In chromium at 1400 and 420 px; screenshots under test-results/shots/test_chart_axes_browser/."""

import re

import pytest

from browser import open_at, run_to_end, shot

QUERY = "prompt=Once%20upon%20a%20time&temperature=0&seed=2&max_new_tokens=12"
# The run's charts on view whose data is the same on every machine (the experiments' are in a tab).
# Not the decode-latency chart: its values are the machine's timings, so whether its largest one
# lands above the last label would depend on the machine's speed. (Its axis has no headroom: Gradio's
# LinePlot gives Vega-Lite no nice domain; a fixed set of values shows the line at the top edge.)
CHARTS = {"#kv-chart": "MiB"}

AXIS_JS = """(sel) => [...document.querySelectorAll(sel + ' svg g.role-axis')]
    .filter((g) => (g.getAttribute('aria-label') || '').startsWith('Y-axis'))
    .flatMap((g) => [...g.querySelectorAll('g.role-axis-label text')].map((t) => t.textContent))"""
LABELS_JS = "(sel) => [...document.querySelectorAll(sel + ' svg [aria-label]')].map((e) => e.getAttribute('aria-label'))"


def number(text: str) -> float:
    return float(text.replace(",", "").replace("\u2212", "-"))


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_each_charts_y_axis_reaches_its_data(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, QUERY)
    run_to_end(page, lambda: page.click("#generate"))
    for sel in CHARTS:  # every step drawn
        page.wait_for_function(f"[...document.querySelectorAll({sel + ' svg g.mark-line path'!r})]"
                               ".some((p) => (p.getAttribute('d').match(/L/g) || []).length >= 10)")
    page.wait_for_timeout(500)  # the colours' redraw settles
    for sel, y in CHARTS.items():
        ticks = [number(t) for t in page.evaluate(AXIS_JS, sel)]
        values = [float(m.group(1)) for a in page.evaluate(LABELS_JS, sel)
                  for m in [re.search(rf"(?:^|; ){re.escape(y)}: ([-\d.e]+)", a)] if m]
        assert ticks and values, sel
        assert max(values) <= max(ticks), f"{sel}: its axis's labels end at {max(ticks)}, its data reaches {max(values)}"
    shot(page, f"kv-{width}", selector="#kv-chart")
    # The rank chart's ticks are whole ranks (issue 62: 1.5, 2.5 over a short span).
    page.get_by_text("Sampling experiments").click()
    page.wait_for_function("document.querySelectorAll('#rank-chart svg g.mark-line path').length > 0")
    page.wait_for_timeout(500)
    ticks = page.evaluate(AXIS_JS, "#rank-chart")
    assert ticks and all(float(number(t)).is_integer() for t in ticks), ticks
    shot(page, f"rank-{width}", selector="#rank-chart")
    page.close()
