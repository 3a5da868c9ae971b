"""The page's control for a sampling setting, made from its schema entry (inference/sampling/settings.py)."""

from __future__ import annotations

import gradio as gr

from inference.sampling.settings import Setting
from inference.request import tokens_message
from server.limits import Limits

# Sliders and number boxes of sampling settings send their value unchecked: the settings schema
# checks it, with the setting's name in its message. Gradio's own check ("Value 7 is greater than
# maximum value 1.") names no field and, for an event outside the queue, answers with an HTTP
# 500. Their range is still given to gradio: the browser's input carries it, and the page says
# under the field when a typed value is beyond it (assets/clamp.js). The marker is a CSS class
# because gradio rebuilds a component from its constructor arguments for each session that
# updates it; a subclass would make gradio write a .pyi file next to this module.
UNCHECKED = "tl-setting"


def _unchecked(component: type) -> None:
    checked = component.preprocess

    def preprocess(self, payload):
        if UNCHECKED in (self.elem_classes or []):
            return payload
        return checked(self, payload)
    component.preprocess = preprocess


_unchecked(gr.Slider)
_unchecked(gr.Number)


def setting_control(s: Setting, value, context: int, label_prefix: str = "", elem_prefix: str = "",
                    limits: Limits | None = None, visible: bool = True, available: bool = True):
    """The page's control for one sampling setting, of the schema's kind (a number box or a
    slider). Neither checks its range itself: the settings schema does (a message naming the
    field). A server cap on max new tokens is the slider's end, and its help says so; max new
    tokens otherwise reaches the context. A setting the engine does not take (`available`
    False) is shown at its neutral value, fixed, and says why."""
    elem_id = elem_prefix + s.name.replace("_", "-")
    label = label_prefix + s.label
    info = None if label_prefix else s.help
    if not available:
        value, info = s.off, "not available with this engine"
    if s.control == "choice":
        return gr.Radio([(shown, v) for v, shown in s.choices], value=value, label=label, info=info,
                        elem_id=elem_id, visible=visible, interactive=None if available else False)
    if s.control == "text":
        long = s.max_chars > 2000  # a schema or a grammar: several lines
        return gr.Textbox(value, label=label, info=info, placeholder=f"e.g. {s.example}", elem_id=elem_id,
                          visible=visible, interactive=None if available else False, max_length=s.max_chars,
                          lines=6 if long else 1, max_lines=20 if long else None)
    lo = s.minimum + s.step if s.min_open else s.minimum  # an open minimum: the first step above it
    if s.control == "number":
        return gr.Number(value, label=label_prefix + s.off_label, precision=None, info=info,
                         elem_id=elem_id, visible=visible, interactive=None if available else False,
                         minimum=lo, maximum=s.maximum, step=s.step, elem_classes=[UNCHECKED])
    hi = s.maximum if s.maximum is not None else context - 1
    cap = limits.max_new_tokens if limits is not None and s.name == "max_new_tokens" else None
    if cap is not None:
        hi, value = min(hi, cap), min(value, cap)
        info = f"{info}; {tokens_message(cap)[:-1].lower()}" if info else tokens_message(cap)
    return gr.Slider(lo, hi, value=value, step=s.step, label=label, info=info, elem_id=elem_id,
                     elem_classes=[UNCHECKED], visible=visible, interactive=None if available else False)


# Vega-Lite's own category colours, in its order.
SERIES_COLORS = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#9d755d")
# A color_map key no series has: what it holds makes Gradio rebuild the chart (see line_colors).
REBUILD = "\u2063drawn"


def line_colors(frame, color: str, ended: bool) -> dict:
    """A line chart's colours, one for each series of `frame` (the data the chart was just given),
    as an update of their own that must reach the page after that data (a `.then` event). Gradio
    builds a chart's colour scale from the data it holds when it builds the chart, and rebuilds
    only when a setting such as color_map changes, never for new data: a chart first drawn empty
    kept an empty scale, and every line it got later had no stroke, invisible. A new color_map
    rebuilds it with the data it then holds: when the series change, and once more when the run
    has `ended`, so that data which came while it was being rebuilt is drawn too."""
    names = [] if frame is None else list(dict.fromkeys(frame[color]))
    colors = {n: SERIES_COLORS[i % len(SERIES_COLORS)] for i, n in enumerate(names)}
    return gr.update(color_map={**colors, REBUILD: "ended" if ended else ""} if names else None)
