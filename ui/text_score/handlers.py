"""The "probability of a text" panel's events: score a typed text (also the /score_text API), or
the prompt of the run as it was fed. On the page a refusal is one line in the panel's result
area, the text left as typed; /score_text refuses with an error."""

from __future__ import annotations

import gradio as gr

from inference.errors import InputError, TokenLabError
from ui.base import Section, named_args, page_error
from ui.controls import page_message
from ui.run_state import RunRecord
from ui.text_score import render


class TextScoreHandlers(Section):
    @named_args("text", "model")
    def score_text(self, text, model, request: gr.Request = None) -> dict:
        """/score_text for scripts: every token of the text given the tokens before it, by one
        forward pass of the chosen model (the BOS token the model adds, if any, read first)."""
        try:
            return self._score_text(text, model, request)
        except TokenLabError as e:
            raise page_error(e) from None

    def score_text_shown(self, text, model, request: gr.Request = None) -> dict:
        """The page's "Score the text": as /score_text, a refusal said in the result area."""
        try:
            return self._score_text(text, model, request)
        except TokenLabError as e:
            return render.refused(page_message(e, one_line=True))

    def _score_text(self, text, model, request: gr.Request | None) -> dict:
        m = self.view(model or "")
        with self._job(request):
            ids, before = m.engine.text_ids(text)
            self._bounded(len(ids))
            scores = m.engine.score_ids(ids, render.TOP)
        return self._shown(scores[before:], scores[:before], "The text", m.tokenizer)

    def score_prompt(self, rec: RunRecord | None, request: gr.Request = None) -> dict:
        """The run's prompt as it was fed (its ids: in chat mode the template's tokens too), in the
        text box and scored; before a run, a line in the result area says so."""
        if rec is None or not rec.prompt_ids:
            return render.refused("Generate first: this scores the prompt of the run.")
        try:
            with self._job(request):
                m = self.view(rec.model)
                self._bounded(len(rec.prompt_ids))
                scores = m.engine.score_ids(rec.prompt_ids, render.TOP)
        except TokenLabError as e:
            return render.refused(page_message(e, one_line=True))
        return {"score_box": rec.prompt_text, **self._shown(scores, [], "The prompt of the run, as fed", m.tokenizer)}

    def _bounded(self, n_tokens: int) -> None:
        """A shared page scores texts of at most its --max-score-tokens (said, never cut)."""
        if (refusal := self.limits.score_refusal(n_tokens)) is not None:
            raise InputError(refusal)

    @staticmethod
    def _shown(scores, before, what: str, tokenizer) -> dict:
        return {"score_view": render.scored_html(scores, tokenizer), "score_md": render.summary_md(scores, before, what),
                "score_data": render.scores_json(scores, len(before))}
