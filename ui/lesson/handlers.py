"""The lesson's events: start it on a prompt and model (one run and a few one-off passes, the
numbers of inference.lesson.explain), and move between its chapters without recomputing."""

from __future__ import annotations

from dataclasses import replace
from html import escape

import gradio as gr

from inference.errors import TokenLabError
from inference.lesson.explain import EXAMPLES, explain
from ui.base import Section, takes_controls
from ui.controls import MODES, Controls, page_message, parse_seed, sampling_params
from ui.lesson import render


# Why an example is read in completion mode while the page is in chat mode.
EXAMPLE_MODE = "the examples are texts to continue"


class LessonHandlers(Section):
    @takes_controls("lesson_prompt", "lesson_mode", "lesson_follow")
    def lesson_start(self, c: Controls, prompt, mode="completion", follow="top", request: gr.Request = None) -> dict:
        """The lesson on this prompt, read in `mode` (the page's, or completion for an example), with
        the page's model, sampling settings and seed; it follows the most likely token, or (follow
        "sampled") one drawn with those settings. Its first chapter shown; a refusal is one line."""
        if not isinstance(prompt, str) or not prompt.strip():
            return self._lesson_refused("Type a prompt first (or pick an example): the lesson follows its next token.")
        mode = mode if mode in MODES else "completion"
        try:
            params = sampling_params(c, None)  # every control that cannot be used, named at once
            params = replace(params, seed=parse_seed(c.seed))
            with self._job(request):
                m = self.view(c.model or "")
                # (the roofline measured anew: the machine's load changes)
                lesson = explain(m.engine, prompt, params, follow="sampled" if follow == "sampled" else "top",
                                 chat=mode == "chat", system=c.system if mode == "chat" else None)
        except TokenLabError as e:
            return self._lesson_refused(page_message(e, one_line=True))
        data = {"model": lesson.model, "prompt": lesson.prompt, "chapters": lesson.chapters, "mode": lesson.mode,
                "follow": lesson.follow, "seed": lesson.seed, "page_mode": c.mode,
                "why_mode": EXAMPLE_MODE if prompt in EXAMPLES and mode != c.mode else ""}
        return {"lesson_data": data, "lesson_index": 0, "lesson_view": render.chapter_html(data, 0),
                "lesson_back": gr.update(interactive=False), "lesson_next": gr.update(interactive=True)}

    @staticmethod
    def _lesson_refused(message: str) -> dict:
        return {"lesson_data": None, "lesson_index": 0,
                "lesson_view": f"<p class='lesson-refused'>⚠ {escape(message)}</p>",
                "lesson_back": gr.update(interactive=False), "lesson_next": gr.update(interactive=False)}

    @staticmethod
    def lesson_move(data, index, by: int) -> dict:
        """The chapter `by` away from `index` (kept within the lesson)."""
        if not data:
            return {"lesson_index": 0, "lesson_view": gr.update(), "lesson_back": gr.update(interactive=False),
                    "lesson_next": gr.update(interactive=False)}
        last = len(data["chapters"]) - 1
        i = min(max(int(index or 0) + by, 0), last)
        return {"lesson_index": i, "lesson_view": render.chapter_html(data, i),
                "lesson_back": gr.update(interactive=i > 0), "lesson_next": gr.update(interactive=i < last)}

    def lesson_next(self, data, index) -> dict:
        return self.lesson_move(data, index, 1)

    def lesson_back(self, data, index) -> dict:
        return self.lesson_move(data, index, -1)
