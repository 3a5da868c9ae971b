"""The run section's components and events: prompt and settings, the streaming output with its
bars, the status line, the KV-cache and latency charts, the statistics and the tokenization, and
the model picker. Other sections are built in its slots (Page.fill: "run.input" under Generate,
"run.output" under the output, "run.bars" under the bars, "run.settings" under the settings)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from inference.sampling.settings import BY_NAME, SHAPING_SETTINGS
from server.limits import ENGINE, MODEL_PICK
from ui.controls import NAMES
from ui.format import bars_html, step_axis
from ui.run import constrain, render
from ui.run.picker import PICK_OUTPUTS
from ui.run_state import RunRecord
from ui.shared import charts, kv, view
from ui.shared.charts import chart_colors
from ui.shared.outputs import RUN_OUTPUTS, STALE_PANELS
from ui.streaming import CHART_INTERVAL_S
from ui.widgets import setting_control

EXAMPLES = [
    ["Write a haiku about the sea.", "chat"],
    ["The capital of France is", "completion"],
    ["今天天气真", "completion"],
    ["def fibonacci(n):\n    ", "completion"],
    ["Once upon a time, a tiny language model", "completion"],
    ["Explain in one sentence why the sky is blue.", "chat"],
]
ASSETS = Path(__file__).parent.parent / "assets"
OUTPUT_JS = (ASSETS / "output.js").read_text(encoding="utf-8")
CLAMP_JS = (ASSETS / "clamp.js").read_text(encoding="utf-8")
# The bars' candidates start a branch when clicked (the branches section's events: the bars' select).
PICK_JS = (ASSETS / "pick.js").read_text(encoding="utf-8")
# On a narrow screen (one column: page.css) a run's text comes under the prompt, the settings and
# the examples: once the run starts the output is brought to the top of the window. On any screen a
# run started from far below (a loom's leaf, a scored text's token) brings it into view: it streams
# there, and nothing where the click was would say so.
OUTPUT_IN_VIEW_JS = """() => {
  const cap = document.querySelector('#output-caption');
  if (!cap) return [];
  const r = cap.getBoundingClientRect();
  if (window.matchMedia('(max-width: 860px)').matches || r.bottom < 0 || r.top > window.innerHeight) {
    cap.scrollIntoView({block: 'start'});
  }
  return [];
}"""
COLOUR_BY = [("colour by final p (sampled from)", "final"), ("colour by raw p (the model's)", "raw")]
COLOUR_BY_JS = "(by) => { document.body.classList.toggle('tl-colour-raw', by === 'raw'); return []; }"
# Counts the runs whose whole chain (the run, its charts, every panel after it) has ended: scripts
# driving the page wait on body[data-tl-settled] rather than on one panel's text.
RUN_SETTLED_JS = """() => {
    document.body.dataset.tlSettled = String(+(document.body.dataset.tlSettled || 0) + 1);
    return [];
}"""
SHOW_LOGP_JS = "(on) => { document.body.classList.toggle('tl-show-logp', on); return []; }"
COPY_TEXT_JS = """() => {
  const el = document.querySelector('#output .tl-out');
  const text = el ? (el.dataset.text || '') : '';
  if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
  return [];
}"""
OUTPUT_CAPTION = ("Generated text, coloured by the probability each token was sampled with: hover or tap a "
                  "token for its alternatives; click it to inspect its step.")
OUTPUT_CAPTION_RAW = ("Generated text, coloured by the probability each token was sampled with where the "
                      "server's numbers give it (greedy, or temperature 1 with no filter), else the model's own "
                      "probability: hover or tap a token for its alternatives; click it to inspect its step.")
# What each run event reads: the controls, and in chat mode the conversation it continues.
RUN_INPUTS = (*NAMES, "history")
# after_run's outputs (it returns only those it changes).
AFTER_OUTPUTS = ("live", "generate", "regenerate", "stop_button", "kv_chart", "latency", "step", "run_chart",
                 "rank_chart", "entropy_chart", *(f"replay_{n}" for n in SHAPING_SETTINGS),
                 "tokens", "downloads", "run_seed", "history", "conversation",
                 "prompt", "status")
BEGIN_OUTPUTS = ("prompt_view", "tokens", "kv_chart", "latency", "live", "generate", "regenerate",
                 "stop_button", "step", "status", "output", "bars", "stats", "notice", *STALE_PANELS,
                 "downloads", "run_chart", "rank_chart", "entropy_chart", "run_seed", "record")


def build(page, h) -> None:
    """The main grid (wide: prompt | settings over output | bars; narrow: prompt, output, bars,
    then the settings: page.css), then the KV-cache and latency row."""
    d, tok, add = h.page.defaults, h.page.engine.tokenizer, page.add
    limits_md = render.limits_markdown(h.page.limits)
    # Wide: the prompt over the settings on the left, the output over its bars on the right, so
    # that a run's text and its bars are in view together; narrow (the wrappers dissolve, page.css):
    # prompt, output, bars, the prompt as fed, then the settings.
    with gr.Row(elem_id="main-grid"):
        with gr.Column(elem_id="left-col"):
            with gr.Column(elem_id="input-col"):
                many = len(h.page.models.labels) > 1
                # The default model's value is "" (as /generate's default): a link to it names none.
                choices = [(h.page.models.default, ""), *h.page.models.labels[1:]]
                add("model", gr.Dropdown(choices, value=d.model, label="Model", visible=many,
                                         info="each loads on its first use", elem_id="model"))
                # The first screen (wide or a phone's): the conversation so far, the prompt, its
                # count and Generate; the mode, the system prompt and the models' memory after them.
                add("conversation", gr.HTML("", elem_id="conversation", visible=d.mode == "chat"))
                add("prompt", gr.Textbox(d.prompt, label="Prompt", lines=3, elem_id="prompt"))
                first = h.run.preview(d.prompt, d.mode, d.system, d.max_new_tokens)  # the counter and the tokens agree
                add("context_count", gr.Markdown(first["context_count"],
                                                 label="Context", elem_id="context-count"))
                with gr.Row(elem_id="run-row"):
                    add("generate", gr.Button("Generate", variant="primary", elem_id="generate"))
                    add("stop_button", gr.Button("Stop", variant="secondary", interactive=False, elem_id="stop"))
                page.fill("run.input")  # (the chat's buttons)
                add("status", gr.Markdown("", label="Status", elem_id="status"))
                add("notice", gr.Markdown("", label="Notice", elem_id="notice"))
                with gr.Row(elem_id="mode-row"):
                    add("mode", gr.Radio(["completion", "chat"], **{"value": d.mode, **render.mode_choice(h.page.view().info)},
                                         label="Mode", elem_id="mode"))
                    # min_width: on a narrow screen it goes under the mode, the whole column wide,
                    # so that the model's default (its placeholder) can be read.
                    add("system", gr.Textbox(
                        d.system, label="System prompt (chat mode)", lines=2, elem_id="system", min_width=300,
                        placeholder=h.page.default_system or "none",
                        info=("empty = the model's default, shown here: its chat template adds it"
                              if h.page.default_system else "empty = no system message")))
                add("model_md", gr.Markdown(h.picker.models_markdown(), elem_id="model-memory", visible=many))
                if limits_md:
                    gr.Markdown(limits_md, elem_id="limits")
                with gr.Accordion("Example prompts", open=False, elem_id="examples"):
                    gr.Examples(EXAMPLES, inputs=page.all(("prompt", "mode")), label=None)
            with gr.Column(elem_id="settings-col"):
                with gr.Accordion("Sampling settings", open=True, elem_id="settings"):
                    for s in BY_NAME.values():
                        if s.group == "main":
                            add(s.name, setting_control(s, getattr(d, s.name), h.page.context, limits=h.page.limits,
                                                        available=s.name in h.page.caps.settings))
                    add("seed", gr.Textbox(d.seed, label="Seed (empty = random)", elem_id="seed"))
                    with add("constrain_box", gr.Accordion("Constrain output: JSON schema, regular expression, grammar",
                                                           open=False, elem_id="constrain")):
                        for s in BY_NAME.values():
                            if s.group == "constrain":
                                add(s.name, setting_control(s, getattr(d, s.name), h.page.context, limits=h.page.limits,
                                                            available=s.name in h.page.caps.settings))
                        if not h.page.caps.masked_mass:
                            gr.Markdown(constrain.NO_MASKED_MASS, elem_id="constraint-note")
                        add("constraint_check", gr.Markdown(constrain.check_text(d.constraint, d.constraint_text),
                                                            elem_id="constraint-check"))
                        add("constraint_example", gr.Dropdown(list(constrain.EXAMPLES), value=None,
                                                              label="Ready examples", elem_id="constraint-example"))
                    more = [s for s in BY_NAME.values() if s.group == "more"]
                    with add("more", gr.Accordion("More settings: min-p, penalties, logit bias, typical-p, cutoffs, "
                                                  "top-nσ, dynamic temperature, XTC, DRY, Mirostat, sampler order, "
                                                  "stop strings", open=False, elem_id="more-settings")):
                        for s in more:
                            add(s.name, setting_control(s, getattr(d, s.name), h.page.context, limits=h.page.limits,
                                                        available=s.name in h.page.caps.settings))
                            if s.name == "sampler_order":  # the order these settings run in, live
                                add("order_view", gr.HTML(h.run.order_view(*(getattr(d, n) for n in SHAPING_SETTINGS)),
                                                          elem_id="order-view"))
                        add("prefix_ids", gr.Textbox(d.prefix_ids, label="Continue after these token ids (a branch; "
                                                     "ID,ID,...)", elem_id="prefix-ids", max_lines=3,
                                                     info="set by clicking a candidate in the bars; the settings "
                                                          "count them as generated"))
                        add("stop", gr.Textbox(d.stop, label="Stop strings (one per line; \\n = newline)", lines=2,
                                               elem_id="stop-strings"))
                    page.fill("run.settings")  # (the share link)
        with gr.Column(elem_id="right-col"):
            with gr.Column(elem_id="output-col"):
                gr.Markdown(OUTPUT_CAPTION_RAW if h.page.caps.logprobs == "raw" else OUTPUT_CAPTION, elem_id="output-caption")
                add("colour_by", gr.Radio(COLOUR_BY, value="final", label="Colour the text by", show_label=False,
                                          container=False, elem_id="colour-by"))
                add("output", gr.HTML(view.output_html(None, tok), label="Generated text", elem_id="output",
                                      js_on_load=OUTPUT_JS))
                with gr.Row():
                    add("copy_text", gr.Button("Copy text", size="sm", elem_id="copy-text"))
                    add("downloads", gr.HTML(view.downloads_html(None, None), elem_id="downloads"))
                page.fill("run.output")  # (edit and continue)
            with gr.Column(elem_id="bars-col"):
                add("step", gr.Slider(0, 1, value=0, step=1, label="Step", interactive=False, elem_id="step"))
                add("show_logp", gr.Checkbox(False, label="Show log p instead of p", elem_id="show-logp"))
                add("bars", gr.HTML(bars_html(None), label="Candidates", elem_id="topk", js_on_load=PICK_JS))
                page.fill("run.bars")  # (the branch tree)
            with gr.Column(elem_id="feed-col"):
                # Shown once a run has fed a prompt (before, the tokens below say what will be fed).
                add("prompt_view", gr.Textbox(label="Prompt as fed to the model", lines=2, max_lines=8,
                                              interactive=False, visible=False, elem_id="prompt-view"))
                add("tokens", gr.HTML(first["tokens"], label="Tokenization", elem_id="tokens"))
    with gr.Row():
        with gr.Column(min_width=320):
            add("kv_chart", gr.LinePlot(charts.kv_frame(RunRecord()), **step_axis(), x_title=charts.KV_X_TITLE, y="MiB",
                                        color="series", color_title=" ", title="KV-cache memory per step",
                                        elem_id="kv-chart"))
            # Our own text, values escaped: not sanitized, so that its terms keep their definitions (as stats').
            add("kv_text", gr.Markdown(kv.kv_formula(h.page.info), label="KV-cache formula", elem_id="kv-formula",
                                       sanitize_html=False))
            add("server_md", gr.Markdown("", elem_id="server-load", visible=h.page.caps.server_load))
        with gr.Column(min_width=320):
            add("latency", gr.LinePlot(charts.latency_frame(RunRecord()), **step_axis(), y="ms",
                                       x_title=charts.LATENCY_X_TITLE, y_title=charts.LATENCY_Y_TITLE,
                                       title="Decode latency per token", elem_id="latency-chart"))
            add("stats", gr.Markdown("No run yet.", label="Run statistics", elem_id="stats", sanitize_html=False))
    add("record", gr.State(None))
    add("history", gr.State([]))
    add("live", gr.Timer(CHART_INTERVAL_S, active=False))
    add("api_tokens", gr.JSON(visible=False, label="Tokens"))


def wire(page, h, demo: gr.Blocks) -> None:
    """The run section's events; page.chain_run starts a run from another section's trigger."""
    # The charts' colours, after every event that gives them data (shared/charts.chart_colors).
    colors = (chart_colors, ("record",), ("kv_chart", "run_chart"))
    page.after_view.insert(0, colors)
    # The whole server's load, where the engine has one: after a run and while it streams.
    server_load = [(h.run.server_load, (), ("server_md",))] if h.page.caps.server_load else []

    def chain_run(started):
        """begin -> generate -> after_run, from an event or a trigger. begin runs in the queue,
        unlimited: its refusal (this tab has a run going, or its visitor their share) is a
        page error, and an unqueued event's error would reach the page as an HTTP 500; only
        if it succeeds is the run queued."""
        b = page.on(started, h.run.begin, inputs=RUN_INPUTS, outputs=BEGIN_OUTPUTS, concurrency_limit=None,
                    show_progress="hidden", api_visibility="private")
        r = page.on(b.success, h.run.generate_on_page, inputs=RUN_INPUTS, outputs=RUN_OUTPUTS,
                    show_progress="hidden", concurrency_id=ENGINE, api_visibility="private", postprocess=False)
        for js in page.run_going_js:  # (the saved work's mark: a reload meanwhile says the run was lost)
            b.success(None, js=js)
        b.success(None, js=OUTPUT_IN_VIEW_JS)
        a = page.on(r.then, h.run.after_run, inputs=("record", "history"), outputs=AFTER_OUTPUTS, queue=False,
                    show_progress="hidden", api_visibility="private")
        for js in page.run_ended_js:
            a.then(None, js=js)
        a = page.chain(a, [colors, *page.after_run, *server_load])
        a.then(None, js=RUN_SETTLED_JS)
        return r

    page.chain_run = chain_run
    chain_run(page["generate"].click)
    # /generate for scripts: the same run, refusing bad input with an error (gradio_client
    # raises it). No button of the page triggers it.
    api_generate = gr.Button(visible=False)
    page.on(api_generate.click, h.run.generate, inputs=NAMES, outputs=RUN_OUTPUTS, api_name="generate",
            show_progress="hidden", concurrency_id=ENGINE, postprocess=False)
    tick = page.on(page["live"].tick, h.run.live_tick, inputs=("record",), outputs=("kv_chart", "latency", "status"),
                   api_visibility="private", queue=False, show_progress="hidden")
    page.chain(tick, [colors, *server_load])
    page["stop_button"].click(h.run.stop, inputs=None, outputs=None, queue=False, api_name="stop")
    context_inputs = ("prompt", "mode", "system", "max_new_tokens", "history", "model", "prefix_ids")
    page.on(lambda fn, **kw: gr.on([page[n].change for n in context_inputs], fn, **kw), h.run.preview,
            inputs=(*context_inputs, "record"), outputs=("context_count", "tokens"), queue=False,
            show_progress="hidden", trigger_mode="always_last", api_visibility="private")
    # Arrow keys and a typed number (input), a drag's end (release): the bars follow.
    gr.on([page["step"].input, page["step"].release], h.run.select_step, inputs=page.all(("record", "step")),
          outputs=page["bars"], api_visibility="private", queue=False, show_progress="hidden",
          trigger_mode="always_last")
    # The sampler order view follows every sampling setting (a typed value, a drag, a link).
    gr.on([page[n].change for n in SHAPING_SETTINGS], h.run.order_view, inputs=page.all(SHAPING_SETTINGS),
          outputs=page["order_view"], queue=False, show_progress="hidden", trigger_mode="always_last",
          api_visibility="private")
    # The constraint: a ready example fills the kind and the text; the text is checked as typed.
    page.on(page["constraint_example"].input, constrain.pick_example, inputs=("constraint_example",),
            outputs=("constraint", "constraint_text"), api_visibility="private", queue=False, show_progress="hidden")
    gr.on([page["constraint"].change, page["constraint_text"].change], constrain.check_text,
          inputs=page.all(("constraint", "constraint_text")), outputs=page["constraint_check"], queue=False,
          show_progress="hidden", trigger_mode="always_last", api_visibility="private")
    page.on(page["output"].select, h.run.select_token, inputs=("record",), outputs=("bars", "step"),
            api_visibility="private", queue=False)
    if server_load:  # and at the page's load
        demo.load(h.run.server_load, inputs=None, outputs=page["server_md"], api_visibility="private", queue=False,
                  show_progress="hidden")
    # The picker: the model loads (on its first use) and what shows its numbers follows it.
    picked = page.on(page["model"].change, h.picker.pick_model,
                     inputs=("model", *context_inputs[:5], "status", "record"), outputs=PICK_OUTPUTS,
                     api_visibility="private", concurrency_id=MODEL_PICK, show_progress="minimal")
    # Then the sections' own (the look inside's sliders, the drafters), once the model is loaded.
    page.chain(picked, page.after_pick)
    if len(h.page.models.labels) > 1:  # what is loaded now, not when the page was built
        loaded = page.on(demo.load, h.picker.models_markdown, outputs=("model_md",), api_visibility="private",
                         queue=False)
        page.chain(loaded, page.after_pick)
    page["copy_text"].click(None, inputs=None, outputs=None, js=COPY_TEXT_JS)
    # A display switch only: every number is rendered both ways and CSS shows one.
    page["show_logp"].change(None, inputs=page["show_logp"], outputs=None, js=SHOW_LOGP_JS)
    page["colour_by"].change(None, inputs=page["colour_by"], outputs=None, js=COLOUR_BY_JS)
    demo.load(None, js=CLAMP_JS)  # a typed value beyond a slider's range is said, not silently clamped
    demo.unload(h.run.closed)
