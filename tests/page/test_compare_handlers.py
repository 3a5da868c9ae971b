"""Compare A/B and the experiments' charts at the handlers: a comparison turns Generate off and Stop
on, B copies the run's settings, the A/B bars stack on a narrow screen, the charts name their
axes and replay keeps the bars' colours (the browser's checks are in test_compare_browser.py)."""

import ui.shared.charts as charts_panel
from helpers import plain
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from helpers import page_run

from ui.controls import shaping_values
from ui.shared.outputs import RUN_OUTPUTS
from ui.layout import build_ui
from server.limits import RUN_GOING
import ui.experiments.render as exp_render
import ui.shared.view as run_render

REQ = SimpleNamespace(session_hash="compare")


def run(h, **kw):
    return page_run(h, REQ, **kw)


def test_compare_turns_generate_off_and_stop_on_and_b_copies_the_run(h, tiny_engine):
    begun = h.experiments.compare_begin(REQ)
    assert begun["generate"]["interactive"] is False and begun["stop_button"]["interactive"] is True
    assert begun["x_button"]["interactive"] is False and begun["compare_button"]["interactive"] is False
    ended = h.experiments.compare_end([])
    assert ended["generate"]["interactive"] is True and ended["stop_button"]["interactive"] is False
    # While a job is going, compare and "Score it" are refused in one line (not a bare "Error").
    cancel = h.page.registry.start(REQ.session_hash)
    try:
        for fn in (h.experiments.compare_begin, h.experiments.likelihood_begin):
            with pytest.raises(gr.Error) as e:
                fn(REQ)
            assert e.value.message == RUN_GOING and "\n" not in e.value.message
    finally:
        h.page.registry.finish(REQ.session_hash, cancel)
    h.experiments.likelihood_begin(REQ)  # nothing going: no refusal
    # B starts as a copy of the page's settings.
    page = build_ui(tiny_engine).tokenlab_page
    d = h.page.defaults
    from inference.sampling.settings import SHAPING_SETTINGS
    assert [page[f"b_{n}"].value for n in SHAPING_SETTINGS] == [getattr(d, n) for n in SHAPING_SETTINGS]
    # A is the main settings: the label says so, not "above" (replay's controls are above it).
    md = [getattr(c, "value", "") for c in build_ui(tiny_engine).blocks.values() if isinstance(c, gr.Markdown)]
    compare_md = next(v for v in md if isinstance(v, str) and v.startswith("**Compare A/B**"))
    assert "Sampling settings" in compare_md and "settings above" not in compare_md


def test_ab_bars_stack_on_a_narrow_screen():
    css = (run_render.__file__.rsplit("/shared/", 1)[0] + "/assets/page.css")
    text = open(css, encoding="utf-8").read()
    assert re.search(r"@media \(max-width: 860px\) \{ #compare-bars \{ flex-direction: column", text)


def test_charts_name_their_axes_and_replay_keeps_the_bars_colours(tiny_engine, h):
    page = build_ui(tiny_engine).tokenlab_page
    for name in ("kv_chart", "run_chart", "compare_chart"):
        # An empty chart shows no lone legend title ("" itself makes vega's chart endlessly tall).
        assert page[name].color_title == " "
    assert page["run_chart"].y_title == "probability" and page["run_chart"].y == "value"
    assert page["entropy_chart"].y == "nats" and "nats" in page["entropy_chart"].y_title
    rec = run(h)
    assert set(charts_panel.run_chart_frames(rec)[0].metric) == {"chosen-token probability"}
    assert charts_panel.entropy_frame(rec).nats.tolist() == [round(s.entropy, 3) for s in rec.steps]
    out = h.experiments.replay_step(rec, 2, *shaping_values(temperature=0.5, top_k=3))
    bars = out["replay_bars"]
    head = re.search(r"tl-head'>(.*?)</div>", bars).group(1)
    assert "final in the run" in head
    # The run's final bars are the main bars' final colour (tl-final); blue (tl-raw) is raw only.
    assert "tl-raw" not in bars and bars.count("class='tl-final'") == bars.count("class='tl-replayed'") > 0
    assert set(RUN_OUTPUTS) >= {"bars"}


def test_b_follows_the_pages_settings_and_the_comparison_lists_every_difference(h, tiny_engine):
    # Issue 62: after a constrained run, the constraint set to none on the page and B given another
    # model, B still ran under the constraint (hidden under "More B settings"). B follows the
    # page's settings, not the last run's, and every setting B changes is listed.
    from inference.sampling.settings import SHAPING_SETTINGS
    demo = build_ui(tiny_engine)
    page = demo.tokenlab_page
    rec = run(h, temperature=0.7, constraint="regex", constraint_text="[a-z ]+")
    after = h.run.after_run(rec, [], REQ)
    assert not any(k.startswith("b_") for k in after)  # the run's end does not set B
    follows = {(d["targets"][0][0], tuple(d["outputs"])) for d in demo.config["dependencies"]
               if d["targets"] and d["targets"][0][1] == "change" and d.get("js") and not d.get("backend_fn")}
    for n in SHAPING_SETTINGS:  # each page setting's change sets its B copy, in the browser
        assert (page[n]._id, (page[f"b_{n}"]._id,)) in follows, n
    a = {n: getattr(h.page.defaults, n) for n in SHAPING_SETTINGS}
    b = {**a, "temperature": 1.5, "constraint": "json_schema", "constraint_text": '{"type": "object"}'}
    line = h.experiments.compare_differences(*a.values(), *b.values(), "", "")
    assert line.startswith("**B differs from A in 3 settings**")
    assert f"Temperature: {a['temperature']:g} → 1.5" in line and "Constrain output: none → JSON schema" in line
    assert "Constraint: empty → " in line
    same = h.experiments.compare_differences(*a.values(), *a.values(), "", "")
    assert same.startswith("**B is A**")
    from ui.controls import Controls
    c = Controls(**{**vars(h.page.defaults), "prompt": "The quick", "max_new_tokens": 4, "seed": "3",
                    "temperature": 0.5})
    out = h.experiments.compare(*c.values(), *({**a, "temperature": 0.5, "top_k": 3}).values(), "", REQ)
    assert out["compare_md"].startswith("**B differs from A in 1 setting**: Top-k: 0 → 3.")
    # Which probability each column averages: the final one, the model's raw one (issue 62).
    assert "mean chosen-token p (final: sampled from)" in plain(out["compare_md"])
    assert "perplexity of its text (raw p: the model's)" in plain(out["compare_md"])
