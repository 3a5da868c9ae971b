"""The events of "Inside one token": the selected step's path, attention, pattern and lens."""

from __future__ import annotations

import gradio as gr

from inference.errors import TokenLabError
from ui.base import Section, named_args, step_index
from ui.inside import render
from ui.run_state import RunRecord


class InsideHandlers(Section):
    def model_picked(self, model) -> dict:
        """A model picked (Page.after_pick): its memory table, and the layer and head sliders over
        its layers and heads."""
        try:
            info = self.view(model).info
        except TokenLabError:
            return {}
        out = {"memory": render.memory_markdown(info)}
        if info.cfg is not None:
            out["layer"] = gr.update(maximum=info.cfg.n_layers - 1, value=info.cfg.n_layers - 1)
            out["head"] = gr.update(maximum=info.cfg.n_heads - 1, value=0)
        return out

    @named_args("rec", "step", "layer", "head")
    def inspect_step(self, rec: RunRecord | None, step, layer, head=0, request: gr.Request = None) -> dict:
        """Stages with shapes and costs, the new token's attention, the logit lens and the full
        attention pattern of one head, for the selected step and layer (one forward pass, kept
        for the next head of the same step and layer)."""
        if rec is None or not rec.steps:
            return {"stages_md": "Generate first, then pick a step to look inside.",
                    "attention": "", "lens": "", "pattern": ""}
        i, m = step_index(rec, step), self.view(rec.model)
        try:
            layer = min(max(int(layer or 0), 0), m.info.cfg.n_layers - 1) if m.info.cfg else 0
        except (TypeError, ValueError, OverflowError):  # (NaN, infinity)
            return {"stages_md": "The layer must be a whole number.", "attention": "", "lens": "", "pattern": ""}
        with self._job(request):
            try:
                capture, pattern = rec.capture_at(i, layer, lambda ids: (m.engine.capture(ids, layer),
                                                                         m.engine.attention_pattern(ids, layer)))
            except TokenLabError as e:  # an engine without the model's activations
                return {"stages_md": f"⚠ {e}", "attention": "", "lens": "", "pattern": ""}
        tok = m.tokenizer
        return {"stages_md": render.stages_markdown(m.info, len(rec.prompt_ids), i, len(rec.given)),
                "attention": render.attention_html(capture, tok), "lens": render.lens_html(capture, tok),
                "pattern": self._pattern(capture.context_ids, pattern, layer, head, tok)}

    def _pattern(self, ids, pattern, layer, head, tokenizer) -> str:
        try:
            head = int(head or 0)
        except (TypeError, ValueError, OverflowError):
            head = 0
        return render.pattern_html(pattern, ids, tokenizer, layer, head)

    def select_head(self, rec: RunRecord | None, step, layer, head) -> str:
        """Another head of the pattern on show: from the kept capture, no forward pass."""
        if rec is None or not rec.steps or rec._capture is None:
            return ""
        (i, lay), (capture, pattern) = rec._capture
        return self._pattern(capture.context_ids, pattern, lay, head, self.view(rec.model).tokenizer)
