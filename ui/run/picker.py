"""The model picker's events: a model chosen loads on its first use (its stage said on the status
line while it loads, Generate off until it can run), then what shows its numbers follows it: the
model card, the KV-cache formula, the context counter, the mode and the sliders' ranges; other
sections follow it by their own hooks (Page.after_pick: the look inside, the drafters)."""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Iterator

import gradio as gr

from inference.device import available_memory_bytes
from inference.errors import TokenLabError
from inference.loading import progress
from ui.base import Section, session_of
from ui.run import render
from ui.run_state import RunRecord
from ui.shared import view
from ui.shared.card import model_card
from ui.shared.kv import kv_formula

LOAD_TICK_S = 0.5  # how often the status line says a first load's stage and time
NOT_STARTED = "⚠ Not started:"  # a click's status for input it refused (the run section's begin)
# What the picker's event sets, besides what other sections' hooks set after it.
PICK_OUTPUTS = ("model_md", "model_card", "kv_text", "context_count", "max_new_tokens", "system", "mode", "status",
                "generate")


class PickerHandlers(Section):
    def models_markdown(self, error: str = "") -> str:
        """Each offered model and what it takes in memory (loaded ones), the memory free now."""
        return render.models_markdown(self.models, available_memory_bytes(), error)

    def pick_model(self, model, prompt, mode, system, max_new_tokens, history=None, status="",
                   rec: RunRecord | None = None, request: gr.Request = None) -> Iterator[dict]:
        """The picker's event: choose_model, said while a model loads on its first use (which
        can take a minute: fetched and imported into the cache first where it is not there),
        with Generate off until it can run; then, under a run made by another model, which
        model made it (the model card, the context line and the next run are the picked one's)."""
        try:
            label = self.models.label_of(model)
        except TokenLabError:
            yield self.choose_model(model, prompt, mode, system, max_new_tokens, history, status)
            return
        going = self.registry.running(session_of(request))  # Generate stays as the run has it
        if not self.models.loaded(label):
            first = {"model_md": self.models_markdown(), "status": render.loading_text(label)}
            yield first if going else {**first, "generate": gr.update(interactive=False)}
            failed = yield from self._load_saying_stages(label)
            if failed is not None:  # said under the picker, once (choose_model would load it again)
                yield {"model_md": self.models_markdown(f"{failed}"), "status": "",
                       **({} if going else {"generate": gr.update(interactive=True)})}
                return
        out = self.choose_model(model, prompt, mode, system, max_new_tokens, history, status)
        if not going:
            out["generate"] = gr.update(interactive=True)
        if "model_card" not in out:  # it could not be loaded: said under the picker
            out["status"] = ""
        elif rec is not None and rec.prompt_ids and rec.model != label:
            out["status"] = render.other_model_text(rec, self.view(rec.model).context, label, self.view(label).context)
        elif rec is not None and rec.done is not None:  # its own model again: its own line
            out["status"] = view.status_text(rec, self.view(label).context, time.monotonic())
        elif str(status).startswith(render.LOADING):
            out["status"] = ""
        yield out

    def _load_saying_stages(self, label: str):
        """Load the model in a thread of its own, the status line saying its stage and time so
        far every LOAD_TICK_S until it is loaded; returns why it could not be (None: loaded)."""
        stage, failed, ended, t0 = [""], [None], threading.Event(), time.monotonic()

        def load():
            with progress.listening(lambda s: stage.__setitem__(0, s)):
                try:
                    self.models.engine(label)
                except TokenLabError as e:  # a refusal (no room for it, no such file): said once
                    failed[0] = e
                finally:
                    ended.set()

        threading.Thread(target=contextvars.copy_context().run, args=(load,), name=f"tokenlab-load-{label}",
                         daemon=True).start()
        while not ended.wait(LOAD_TICK_S):
            yield {"status": render.loading_text(label, stage[0] or "starting", time.monotonic() - t0)}
        return failed[0]

    def choose_model(self, model, prompt, mode, system, max_new_tokens, history=None, status="") -> dict:
        """A model chosen in the picker: loaded now if this is its first use (a load that
        cannot fit is refused, said under the picker), then the model card, the KV-cache
        formula, the context counter, the system prompt's default and the new tokens' range
        follow it. A status saying why a run did not start is about the model before: it goes
        (Generate checks again); a run's own status stays."""
        try:
            m = self.view(model)
        except TokenLabError as e:
            return {"model_md": self.models_markdown(f"{e}")}
        cap = self.limits.max_new_tokens
        most = m.context - 1 if cap is None else min(m.context - 1, cap)
        out = {"model_md": self.models_markdown(), "model_card": model_card(m.info), "kv_text": kv_formula(m.info),
               "context_count": self.runs.count_context(prompt, mode, system, max_new_tokens, history, model),
               "max_new_tokens": gr.update(maximum=most),
               "system": gr.update(placeholder=m.default_system or "none"),
               "mode": gr.update(**render.mode_choice(m.info))}
        if str(status or "").startswith(NOT_STARTED):
            out["status"] = ""
        return out
