"""The model card section: under the lesson's entry, the model's name, shapes, size and where it
runs (ui/shared/card.py renders it; the model picker's event sets it to the model picked)."""

from __future__ import annotations

import gradio as gr

from ui.shared.card import model_card


def build(page, h) -> None:
    # Our own text, its values escaped: not sanitized, so that its terms keep their definitions.
    page.add("model_card", gr.Markdown(model_card(h.page.info), elem_id="model-card", sanitize_html=False))
