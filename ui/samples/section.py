"""The many-samples panel's components and events: N, the button and its Stop, the outcomes and
the first step's table; /samples for scripts."""

from __future__ import annotations

import gradio as gr

from inference.samples import MAX_SAMPLES
from ui.controls import NAMES
from server.limits import ENGINE
from ui.widgets import UNCHECKED

DEFAULT_N = 16
OUTPUTS = ("samples_md", "samples_outcomes", "samples_first", "samples_data")


def build(page, h) -> None:
    add = page.add
    most = min(MAX_SAMPLES, h.page.limits.max_samples or MAX_SAMPLES)
    with gr.Accordion("Many samples: draw N continuations at once and compare them with the model's "
                      "probabilities", open=False, elem_id="samples-panel"):
        gr.Markdown("The prompt and settings above, N times with seeds s, s+1, …, s+N−1 (s: the seed box, else "
                    "random), as N runs in one batch. Sample k is exactly the run Generate makes with seed s+k.")
        with gr.Row():
            add("n_samples", gr.Slider(1, most, value=min(DEFAULT_N, most), step=1, label="Samples (N)",
                                       info=f"at most {most}" + (" on this server" if most < MAX_SAMPLES else ""),
                                       elem_id="n-samples", min_width=200,
                                       # checked by the handler, with a message naming the field and the cap
                                       elem_classes=[UNCHECKED]))
            with gr.Column(min_width=200):
                add("samples_button", gr.Button("Draw N samples", variant="primary", elem_id="samples"))
                add("samples_stop", gr.Button("Stop", interactive=False, elem_id="samples-stop"))
        add("samples_md", gr.Markdown("", label="Samples summary", elem_id="samples-summary"))
        add("samples_outcomes", gr.HTML("", label="Distinct outcomes", elem_id="samples-outcomes"))
        add("samples_first", gr.HTML("", label="First step against the model", elem_id="samples-first"))
        add("samples_data", gr.JSON(visible=False, label="Samples"))


def wire(page, h, demo) -> None:
    # /samples for scripts: the same checks and refusals; no button of the page triggers it.
    # Wired first, so that it takes the name (the page's own event would get it otherwise).
    api = gr.Button(visible=False)
    page.on(api.click, h.samples.samples, inputs=(*NAMES, "n_samples"), outputs=OUTPUTS, api_name="samples",
            concurrency_id=ENGINE, show_progress="hidden")
    started = page.on(page["samples_button"].click, h.samples.samples_started, outputs=("samples_button", "samples_stop"),
                      queue=False, api_visibility="private", show_progress="hidden")
    run = page.on(started.then, h.samples.samples, inputs=(*NAMES, "n_samples", "history"), outputs=OUTPUTS,
                  concurrency_id=ENGINE, api_visibility="private", show_progress="hidden")
    page.on(run.then, h.samples.samples_ended, outputs=("samples_button", "samples_stop"), queue=False,
            api_visibility="private", show_progress="hidden")
    page["samples_stop"].click(h.run.stop, inputs=None, outputs=None, queue=False, api_visibility="private")
