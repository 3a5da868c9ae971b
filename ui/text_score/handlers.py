"""The "probability of a text" panel's events: score a typed text (also the /score_text API), or
the prompt of the run as it was fed; a token of it clicked, the choices to run from there, and
one of them clicked, the run (the tab's next, through the one prepared request: Runs.open_next,
then the run section's chain). On the page a refusal is one line in the panel's result area,
the text left as typed; /score_text refuses with an error."""

from __future__ import annotations

import gradio as gr

from inference.errors import InputError, TokenLabError
from ui.base import Section, named_args, page_error, session_of
from ui.controls import page_message
from ui.run_state import FromText, RunRecord
from ui.text_score import render


# A refusal: nothing kept to run from.
NOT_KEPT = {"score_state": None, "score_branch": ""}


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
        """The page's "Score the text": as /score_text, a refusal said in the result area; the
        text kept to run from (score_state) and the hint to click a token."""
        try:
            return self._score_text(text, model, request, kept=True)
        except TokenLabError as e:
            return {**render.refused(page_message(e, one_line=True)), **NOT_KEPT}

    def _score_text(self, text, model, request: gr.Request | None, kept: bool = False) -> dict:
        m = self.view(model or "")
        with self._job(request):
            ids, before = m.engine.text_ids(text)
            self._bounded(len(ids))
            scores = m.engine.score_ids(ids, render.TOP)
        out = self._shown(scores[before:], scores[:before], "The text", m.tokenizer)
        return {**out, **self._kept(m.label, text, ids, before, scores[before:])} if kept else out

    def score_prompt(self, rec: RunRecord | None, request: gr.Request = None) -> dict:
        """The run's prompt as it was fed (its ids: in chat mode the template's tokens too), in the
        text box and scored; before a run, a line in the result area says so."""
        if rec is None or not rec.prompt_ids:
            return {**render.refused("Generate first: this scores the prompt of the run."), **NOT_KEPT}
        try:
            with self._job(request):
                m = self.view(rec.model)
                self._bounded(len(rec.prompt_ids))
                scores = m.engine.score_ids(rec.prompt_ids, render.TOP)
        except TokenLabError as e:
            return {**render.refused(page_message(e, one_line=True)), **NOT_KEPT}
        return {"score_box": rec.prompt_text, **self._shown(scores, [], "The prompt of the run, as fed", m.tokenizer),
                **self._kept(rec.model, rec.prompt_text, rec.prompt_ids, 0, scores)}

    @staticmethod
    def _kept(model: str, text: str, ids: list[int], before: int, scores) -> dict:
        """What a click on a scored token runs from: the model, the text and its ids as scored
        (`before` of them fed ahead of the tokens shown) and the tokens shown."""
        return {"score_state": {"model": model, "text": text, "ids": list(ids), "before": before,
                                "scores": list(scores)}, "score_branch": render.BRANCH_HINT}

    @staticmethod
    def _text_before(tok, state: dict, at: int) -> str:
        """The text of the scored ids before token `at` (the tokens fed ahead of the text left
        out), as the text has it: a sentencepiece tokenizer's first piece holds a space the text
        does not (its dummy prefix), which is not the text's."""
        ids, before, text = state["ids"], state["before"], state["text"]
        whole = tok.decode(ids[before:])
        lead = 1 if whole.startswith(" ") and not text.startswith(" ") else 0
        return tok.decode(ids[before:at])[lead:]

    def pick_token(self, state: dict | None, evt: gr.SelectData) -> str:
        """A token of the scored text clicked (evt.index: its chip's first token): the choices to
        run from there (render.branch_html)."""
        if not state:
            return ""
        try:
            i = int(evt.index)
        except (TypeError, ValueError, AttributeError):
            return render.BRANCH_HINT
        return render.branch_html(state["scores"], i, state["before"])

    def run_from_text(self, state: dict | None, model, evt: gr.SelectData, request: gr.Request = None) -> dict:
        """One of those choices clicked (evt.value "at:" or "at:token id"): the tab's next run
        starts there (Runs.open_next; the run section's chain, after this, prepares it by
        prepare_from_text), on the page's settings and seed. The controls show it: completion
        mode, the text before that token as the prompt, the candidate as the given id (a link
        then reads that text again; the run reads the ids as scored). A page error where there
        is nothing to run from, or the text was scored on another model than the one picked."""
        if not state:
            raise gr.Error("Score a text first, then click one of its tokens.", print_exception=False)
        try:
            at_text, _, cand_text = str(evt.value).partition(":")
            at, candidate = int(at_text), (int(cand_text) if cand_text else None)
            shown = state["scores"][at - state["before"]]
        except (TypeError, ValueError, AttributeError, IndexError):
            raise gr.Error("Click a token of the scored text, then one of its choices.", print_exception=False) from None
        if candidate is not None and candidate not in {c.id for c in shown.top}:
            raise gr.Error(f"Token {candidate} is not among the model's candidates there.", print_exception=False)
        m = self.view(model or "")
        if m.label != state["model"]:
            raise gr.Error(f"The text was scored on {state['model']}: pick that model, or score the text again on "
                           f"{m.label}.", print_exception=False)
        text = self._text_before(m.tokenizer, state, at)
        label = f"token {at - state['before'] + 1} of the scored text"  # as the choices' panel numbers it
        self.runs.open_next(session_of(request), FromText(state["model"], tuple(state["ids"]), at, candidate, text, label))
        return {"prompt": text, "mode": "completion", "prefix_ids": "" if candidate is None else str(candidate)}

    def _bounded(self, n_tokens: int) -> None:
        """A shared page scores texts of at most its --max-score-tokens (said, never cut)."""
        if (refusal := self.limits.score_refusal(n_tokens)) is not None:
            raise InputError(refusal)

    @staticmethod
    def _shown(scores, before, what: str, tokenizer) -> dict:
        return {"score_view": render.scored_html(scores, tokenizer), "score_md": render.summary_md(scores, before, what),
                "score_data": render.scores_json(scores, len(before))}
