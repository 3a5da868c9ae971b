"""The layout and wording at the renderers: sizes in the page's one
unit, a few samples' shares not rounded away, a chi-square note that says only what applies, the
KV chart from the first real step. The browser's checks are in test_layout_browser.py."""

import ui.shared.charts as charts_panel
import re
from fractions import Fraction
from types import SimpleNamespace

import pytest

from inference.events import DoneEvent
from ui.controls import Controls
from ui.format import binary_size
from ui.handlers import Handlers
from ui.inside.render import memory_markdown, stages_markdown
from ui.samples.render import SampleBatch, fit_html, outcomes_html, ratio
from ui.samples.stats import OTHER, Row
import ui.shared.kv as kv_panel

POWERS = {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30}


def bytes_of(text: str) -> tuple[float, float]:
    """'108.00 MiB' -> (its bytes, the most its rounding can hide)."""
    value, unit = text.split()
    scale = 2 ** POWERS[unit]
    return float(value.replace(",", "")) * scale, (0.005 * scale if unit != "B" else 0.5)


def test_binary_size_names_each_size_in_its_unit():
    assert [binary_size(n) for n in (4, 1023, 1024, 140_544, 113_246_208, 3 * 2**30)] == [
        "4 B", "1,023 B", "1.00 KiB", "137.25 KiB", "108.00 MiB", "3.00 GiB"]


def test_inside_one_token_gives_bytes_in_binary_units_as_the_kv_panel(tiny_engine):
    info = tiny_engine.describe()
    memory, path = memory_markdown(info), stages_markdown(info, n_prompt=4, step=2)
    assert not re.search(r"\d [kMGT]B\b", memory + path)  # no decimal megabytes beside the KV panel's MiB
    rows = [r.split("|")[1:-1] for r in memory.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert len(rows) >= 4
    for name, params, size in rows:
        exact = int(params.replace(",", "")) * info.dtype.itemsize
        shown, slack = bytes_of(size.strip())
        assert abs(shown - exact) <= slack, (name, size, exact)


def test_a_few_samples_shares_are_exact():
    # The share is count / samples exactly where its decimals end (as they do for 8, 16, 64 samples).
    for k, n in ((1, 8), (3, 16), (1, 64), (5, 40), (8, 8), (0, 8)):
        assert Fraction(ratio(k, n, 100, 4, 1)) == Fraction(100 * k, n)
    assert ratio(1, 3, 100, 4, 1) == "≈33.3" and ratio(1, 3) == "≈0.3333"
    b = SampleBatch(8, 42)
    for k in range(8):
        b.done[k] = DoneEvent("length", "same" if k < 2 else f"text {k}", "", 3, 4, 1.0, 1.0, 42 + k, 4, False)
    table = outcomes_html(b)
    shares = re.findall(r"<td class='tl-num'>(\S+?)%</td>", table)
    assert shares == ["25"] + ["12.5"] * 6, shares


def test_the_chi_square_note_says_only_what_applies():
    spread = [Row(1, "a", 3, 0.4, 3.2), Row(2, "b", 4, 0.4, 3.2), Row(OTHER, "rest", 1, 0.2, 1.6)]
    note = fit_html(None, 8, spread)  # temperature 1: no token has all the probability
    assert "no test" in note and "more samples help" in note
    assert "temperature 0" not in note and "all the probability" not in note
    greedy = [Row(1, "a", 8, 1.0, 8.0), Row(OTHER, "rest", 0, 0.0, 0.0)]
    note = fit_html(None, 8, greedy)
    assert "one token has all the probability" in note and "more samples help" not in note


def test_the_kv_chart_starts_at_step_0_with_the_prompts_prefill(tiny_engine):
    h = Handlers(tiny_engine)
    c = Controls(prompt="The quick brown fox", max_new_tokens=6, seed="3")
    rec = list(h.run.generate(*c.values(), SimpleNamespace(session_hash="kv")))[-1]["record"]
    frame = charts_panel.kv_frame(rec)
    used = frame[frame.series.str.startswith("used")]
    per = h.page.info.kv_bytes_per_position
    assert frame.step.min() == 0 and list(used.step) == list(range(len(rec.steps)))
    # Step 0's point is the cache after the prompt's prefill: the prompt's positions, no more.
    assert used.MiB.iloc[0] == pytest.approx(len(rec.prompt_ids) * per / 2**20)
    assert "prefill" in charts_panel.KV_X_TITLE and "step 0" in charts_panel.KV_X_TITLE
