"""The events of "Inside one token": the selected step's path, attention, pattern and lens."""

from __future__ import annotations

import gradio as gr

from inference.errors import TokenLabError
from ui.base import PageBase, named_args, step_index
from ui.inside import render
from ui.run_state import RunRecord


class InsideHandlers(PageBase):
    @named_args("rec", "step", "layer", "head")
    def inspect_step(self, rec: RunRecord | None, step, layer, head=0, request: gr.Request = None) -> dict:
        """Stages with shapes and costs, the new token's attention, the logit lens and the full
        attention pattern of one head, for the selected step and layer (one forward pass, kept
        for the next head of the same step and layer)."""
        if rec is None or not rec.steps:
            return {"stages_md": "Generate first, then pick a step to look inside.",
                    "attention": "", "lens": "", "pattern": ""}
        i = step_index(rec, step)
        try:
            layer = min(max(int(layer or 0), 0), self.info.cfg.n_layers - 1) if self.info.cfg else 0
        except (TypeError, ValueError):
            return {"stages_md": "The layer must be a whole number.", "attention": "", "lens": "", "pattern": ""}
        with self._job(request):
            try:
                capture, pattern = rec.capture_at(i, layer, lambda ids: (self.engine.capture(ids, layer),
                                                                         self.engine.attention_pattern(ids, layer)))
            except TokenLabError as e:  # an engine without the model's activations
                return {"stages_md": f"⚠ {e}", "attention": "", "lens": "", "pattern": ""}
        tok = self.engine.tokenizer
        return {"stages_md": render.stages_markdown(self.info, len(rec.prompt_ids), i),
                "attention": render.attention_html(capture, tok), "lens": render.lens_html(capture, tok),
                "pattern": self._pattern(capture.context_ids, pattern, layer, head)}

    def _pattern(self, ids, pattern, layer, head) -> str:
        try:
            head = int(head or 0)
        except (TypeError, ValueError):
            head = 0
        return render.pattern_html(pattern, ids, self.engine.tokenizer, layer, head)

    def select_head(self, rec: RunRecord | None, step, layer, head) -> str:
        """Another head of the pattern on show: from the kept capture, no forward pass."""
        if rec is None or not rec.steps or rec._capture is None:
            return ""
        (i, lay), (capture, pattern) = rec._capture
        return self._pattern(capture.context_ids, pattern, lay, head)
