"""The components and events of "Inside one token": the selected step's path through the model,
the attention of a layer, the full pattern of a head, the logit lens, and the memory table."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ui.inside.render import INSIDE_NOTE, memory_markdown
from server.limits import ENGINE

PATTERN_JS = (Path(__file__).parent.parent / "assets" / "pattern.js").read_text(encoding="utf-8")


def build(page, h) -> None:
    add, internals = page.add, h.page.caps.internals
    with gr.Accordion("Inside one token: the path through the model at the selected step", open=False):
        if not internals:
            gr.Markdown(INSIDE_NOTE, elem_id="inside-note")
        cfg = h.page.info.cfg
        n_layers, n_heads = (cfg.n_layers, cfg.n_heads) if cfg else (1, 1)
        with gr.Row(visible=internals):
            add("layer", gr.Slider(0, n_layers - 1, value=n_layers - 1, step=1, label="Attention layer",
                                   elem_id="inspect-layer" if internals else None, min_width=200))
            add("head", gr.Slider(0, n_heads - 1, value=0, step=1, label="Head (full pattern)",
                                  elem_id="inspect-head", min_width=200))
            add("inspect_button", gr.Button("Look inside the selected step",
                                            elem_id="inspect" if internals else None, min_width=200))
        add("stages_md", gr.Markdown("", elem_id="stages", visible=internals))
        with gr.Tabs(visible=internals):
            with gr.Tab("Attention", elem_id="tab-attention"):
                add("attention", gr.HTML("", elem_id="attention" if internals else None))
            with gr.Tab("Full pattern", elem_id="tab-pattern"):
                add("pattern", gr.HTML("", elem_id="pattern", js_on_load=PATTERN_JS))
            with gr.Tab("Logit lens", elem_id="tab-lens"):
                add("lens", gr.HTML("", elem_id="lens" if internals else None))
        add("memory", gr.Markdown(memory_markdown(h.page.info), elem_id="memory"))
    # A model picked: its memory table, the sliders over its layers and heads.
    page.after_pick.append((h.inside.model_picked, ("model",), ("memory", "layer", "head")))


def wire(page, h, demo) -> None:
    if not h.page.caps.internals:
        return
    args = dict(inputs=("record", "step", "layer", "head"), outputs=("stages_md", "attention", "lens", "pattern"),
                api_visibility="private", concurrency_id=ENGINE)
    page.on(page["inspect_button"].click, h.inside.inspect_step, **args)
    layer = page["layer"]
    page.on(lambda fn, **kw: gr.on([layer.input, layer.release], fn, trigger_mode="always_last", **kw),
            h.inside.inspect_step, **args)
    head = page["head"]
    gr.on([head.input, head.release], h.inside.select_head, inputs=page.all(("record", "step", "layer", "head")),
          outputs=page["pattern"], api_visibility="private", queue=False, trigger_mode="always_last")
