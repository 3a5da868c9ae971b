"""The sampling experiments' components and events: per-step charts of the run, replay of the
selected step, compare A/B and "how likely was X?"."""

from __future__ import annotations

import gradio as gr

from inference.sampling.settings import BY_NAME, SHAPING_SETTINGS
from ui.controls import NAMES
from ui.experiments.render import CHARTS_CAPTION, CHARTS_NOTE, REPLAY_NOTE, two_models_frame
from ui.experiments.render import differences_md as render_differences
from ui.shared.charts import entropy_frame, rank_axis, run_chart_frames
from ui.format import COMPARE_COLOR_MAP, step_axis
from server.limits import ENGINE
from ui.run_state import RunRecord
from ui.widgets import setting_control

# A chart's y axis takes its data's extent with headroom: Vega-Lite rounds an axis left to it
# out to the next tick ("nice"), but not one with a set end (gr.LinePlot's y_lim), whose line
# then runs along the top edge, its end cut. Probabilities reach 1: their axis ends past it.
PROBABILITY_LIM = [0, 1.05]


def build(page, h) -> None:
    d, add, internals = h.page.defaults, page.add, h.page.caps.internals
    with gr.Accordion("Sampling experiments: the pipeline of a step, replay, compare A/B, "
                      "how likely was X?", open=False):
        if not h.page.caps.whole_distribution:
            gr.Markdown(CHARTS_NOTE, elem_id="charts-note")
        run_frame, rank_frame = run_chart_frames(RunRecord())
        # Short titles: a chart's title is cut at its width, never wrapped; the caption explains.
        gr.Markdown(CHARTS_CAPTION, elem_id="charts-caption")
        with gr.Row():
            add("run_chart", gr.LinePlot(run_frame, **step_axis(), y="value", color="metric", y_lim=PROBABILITY_LIM,
                                         y_title="probability", color_title=" ", title="Chosen token's probability",
                                         elem_id="run-chart", min_width=320))
            add("entropy_chart", gr.LinePlot(entropy_frame(RunRecord()), **step_axis(), y="nats",
                                             y_title="entropy (nats)", title="Raw entropy",
                                             elem_id="entropy-chart", min_width=320))
            add("rank_chart", gr.LinePlot(rank_frame, **step_axis(), y="rank", title="Chosen token's raw rank",
                                          y_lim=rank_axis(None), y_axis_format=",d", elem_id="rank-chart",
                                          min_width=320))
        # Without the whole logit vector there is no replay: its parts exist, hidden, so that a
        # run's end still has them to set.
        if not internals:
            gr.Markdown(REPLAY_NOTE, elem_id="replay-note")
        gr.Markdown("**Replay the selected step** under other settings: recomputed from the step's "
                    "logits, no sampling. The controls start at the run's settings and the replay "
                    "follows them as they move.", visible=internals)
        with gr.Row(visible=internals):
            for n in SHAPING_SETTINGS:
                if BY_NAME[n].group == "main":
                    add(f"replay_{n}", setting_control(BY_NAME[n], getattr(d, n), h.page.context, "Replay ", "replay-"))
        with gr.Accordion("More replay settings", open=False, visible=internals, elem_id="replay-more"):
            with gr.Row():
                for n in SHAPING_SETTINGS:
                    if BY_NAME[n].group != "main":
                        add(f"replay_{n}", setting_control(BY_NAME[n], getattr(d, n), h.page.context, "Replay ", "replay-"))
        add("replay_button", gr.Button("Replay the selected step", elem_id="replay" if internals else None,
                                       visible=internals))
        add("replay_md", gr.Markdown("", elem_id="replay-stages", visible=internals))
        add("replay_bars", gr.HTML("", elem_id="replay-bars", visible=internals))
        many = len(h.page.models.labels) > 1
        gr.Markdown("**Compare A/B**: A is a run with the page's own model and *Sampling settings* (at the top "
                    "of the page); B is a run with the B settings below, which follow the page's as they change. "
                    "Change one of B's to compare; same prompt, same seed."
                    + (" With two models whose tokenizers agree, both also read A's text and their "
                       "distributions are compared at every step." if many else ""), elem_id="compare-label")
        add("model_b", gr.Dropdown([("A's model", ""), *h.page.models.labels], value="", label="B's model (empty: A's)",
                                   visible=many, elem_id="model-b"))
        with gr.Row():
            for n in SHAPING_SETTINGS:
                if BY_NAME[n].group == "main":
                    add(f"b_{n}", setting_control(BY_NAME[n], getattr(d, n), h.page.context, "B ", "b-",
                                                  available=n in h.page.caps.settings))
        with gr.Accordion("More B settings", open=False, elem_id="b-more"):
            with gr.Row():
                for n in SHAPING_SETTINGS:
                    if BY_NAME[n].group != "main":
                        add(f"b_{n}", setting_control(BY_NAME[n], getattr(d, n), h.page.context, "B ",
                                                      "b-", available=n in h.page.caps.settings))
        add("compare_diff", gr.Markdown(render_differences([]), elem_id="compare-diff"))
        add("compare_button", gr.Button("Run A and B", elem_id="compare"))
        # Our own text, every value in it escaped: not sanitized, so that its terms keep their definitions.
        add("compare_md", gr.Markdown("", label="Comparison", elem_id="compare-summary", sanitize_html=False))
        with gr.Row():
            for name, label in (("out_a", "A"), ("out_b", "B")):
                add(name, gr.HighlightedText([(f"{label}'s text comes here with Run A and B.", None)], label=label,
                                             color_map=COMPARE_COLOR_MAP, show_legend=True,
                                             show_inline_category=False, elem_id=f"compare-{label.lower()}",
                                             min_width=300))
        add("compare_chart", gr.LinePlot(two_models_frame(None), **step_axis(), y="value", color="series", color_title=" ",
                                         title="Two models along A's text", label="Two models per step", visible=False,
                                         elem_id="compare-chart"))
        with gr.Row(elem_id="compare-bars"):
            for name, label in (("bars_a", "A"), ("bars_b", "B")):
                add(name, gr.HTML("", label=f"{label}'s candidates at the divergence",
                                  elem_id=f"compare-bars-{label.lower()}", min_width=320))
        gr.Markdown("**How likely was X?** Any continuation, scored token by token at the selected "
                    "step's position (teacher-forced).")
        with gr.Row():
            add("x_text", gr.Textbox(" Paris", label="Continuation", elem_id="likely-text"))
            add("x_button", gr.Button("Score it", elem_id="likely"))
        add("x_md", gr.Markdown("", elem_id="likely-table"))


def wire(page, h, demo) -> None:
    replay_inputs = [f"replay_{n}" for n in SHAPING_SETTINGS]
    if h.page.caps.internals:
        # The replay follows its controls (a typed value, a drag, arrow keys); one forward pass
        # per step, kept, so that moving them is cheap.
        args = dict(inputs=("record", "step", *replay_inputs), outputs=("replay_md", "replay_bars"),
                    api_visibility="private", concurrency_id=ENGINE, show_progress="hidden")
        page.on(page["replay_button"].click, h.experiments.replay_step, **args)
        triggers = [e for n in replay_inputs for e in ((page[n].input, page[n].release)
                                                      if isinstance(page[n], gr.Slider) else
                                                      (page[n].submit, page[n].blur) if isinstance(page[n], gr.Textbox) else
                                                      (page[n].input,))]
        page.on(lambda fn, **kw: gr.on(triggers, fn, trigger_mode="always_last", **kw), h.experiments.replay_step, **args)
    # B follows the page's settings as they change (typed, a link, a branch, a restored run), in the
    # browser: B starts from the page's current settings, and a B setting changed by hand stays
    # until the page's own changes. What B then differs in is said above its button.
    b_names = [f"b_{n}" for n in SHAPING_SETTINGS]
    for n in SHAPING_SETTINGS:
        page[n].change(None, inputs=page[n], outputs=page[f"b_{n}"], js="(v) => v", queue=False,
                       show_progress="hidden", api_visibility="private")
    page.on(lambda fn, **kw: gr.on([page[n].change for n in (*SHAPING_SETTINGS, *b_names, "model", "model_b")], fn,
                                   trigger_mode="always_last", **kw),
            h.experiments.compare_differences, inputs=(*SHAPING_SETTINGS, *b_names, "model", "model_b"),
            outputs=("compare_diff",), queue=False, show_progress="hidden", api_visibility="private")
    # /compare for scripts, registered before the page's own compare event so that it keeps the
    # name: the page's click first turns Generate off and Stop on, then compares, then turns them back.
    compare = dict(inputs=(*NAMES, *(f"b_{n}" for n in SHAPING_SETTINGS), "model_b"),
                   outputs=("out_a", "out_b", "compare_md", "compare_chart", "bars_a", "bars_b"), concurrency_id=ENGINE)
    page.on(gr.Button(visible=False).click, h.experiments.compare, api_name="compare", **compare)
    buttons = ("generate", "regenerate", "compare_button", "x_button", "stop_button")
    begun = page.on(page["compare_button"].click, h.experiments.compare_begin, outputs=buttons, concurrency_limit=None,
                    show_progress="hidden", api_visibility="private")
    compared = page.on(begun.success, h.experiments.compare, api_visibility="private", **compare)
    page.on(compared.then, h.experiments.compare_end, inputs=("history",), outputs=buttons, queue=False,
            show_progress="hidden", api_visibility="private")
    # "Score it": refused in one line (a toast) while a job is going, else scored.
    scored = page.on(page["x_button"].click, h.experiments.likelihood_begin, concurrency_limit=None, show_progress="hidden",
                     api_visibility="private")
    page.on(scored.success, h.experiments.likelihood, inputs=("record", "step", "x_text"), outputs=("x_md",),
            api_visibility="private", concurrency_id=ENGINE)
