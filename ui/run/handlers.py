"""The run section's events: a run from the click to its end (also the /generate API), the
status line while it waits, the step shown in the bars, the context counter and the sampler
order. The run itself is the page's (ui/shared/runs.py): prepared once at the click, streamed
there; the model picker's events are ui/run/picker.py."""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import gradio as gr

from inference.errors import TokenLabError
from inference.sampling.settings import SHAPING_SETTINGS
from ui.base import Section, failure_line, named_args, session_of, step_index, takes_controls
from ui.controls import Controls, page_message, sampling_params
from ui.run import render
from ui.run.picker import NOT_STARTED
from ui.run_state import RunRecord
from ui.shared import view
from ui.shared.charts import charts, kv_frame, latency_frame
from ui.shared.conversation import conversation_html, turn_if_answered
from ui.shared.kv import server_load_markdown
from ui.shared.outputs import STALE_PANELS


class RunHandlers(Section):
    """A run on the page: its click (begin), its stream (generate_on_page, /generate), its end
    (after_run), stopped; the step shown; the prompt's preview and the server's load."""

    @takes_controls(after=("history",))
    def begin(self, c: Controls, request: gr.Request = None, history=None) -> dict:
        """At the click, before the run is queued.

        Valid input: the prompt as fed and its tokens, every panel of the previous run cleared
        (output, bars, statistics, charts, replay, likelihood, inside one token) and its
        downloads, whole-run charts and seed reset, Generate disabled and Stop enabled, the
        step slider spanning the steps to come, the chart timer on, and a waiting record (the
        status line says what the run waits for). Bad input: the error in the status line and
        every panel kept as it was; `generate` refuses it too. A session with a job going, or a
        client at its share, is refused here with a page error (begin runs in the queue,
        unlimited, so that this is no HTTP 500), and the run is not queued."""
        # A beam to open, or a scored text's point to run from: this click's only, refused or not.
        opened = self.runs.take_opened(session_of(request))
        session = self.admit(request)
        try:
            # every control that cannot be used, named as the page labels it
            rec = self.runs.prepare(c, None, history, opened=opened)
        except TokenLabError as e:
            return {"status": f"{NOT_STARTED} {page_message(e)}"}
        self.runs.hold(session, rec)  # what generate_on_page runs: the run is prepared once
        rec = dataclasses.replace(rec, seed=None)  # (shown once the run has it)
        tok = self.view(rec.model).tokenizer
        return {
            "prompt_view": gr.update(value=view.fed_text(tok, rec), visible=True),
            "tokens": view.run_tokens_html(tok, rec.prompt_ids),
            "live": gr.Timer(active=True),
            "generate": gr.update(interactive=False), "regenerate": gr.update(interactive=False),
            "stop_button": gr.update(interactive=True, variant="stop"),
            "step": gr.update(minimum=0, maximum=max(rec.max_steps - 1, 1), value=0, interactive=False),
            "status": self.runs.status(rec, session),
            "output": view.output_html(None, None, empty="Waiting for the engine…"),
            "bars": self._bars(None), "stats": "Waiting for the engine…", "notice": "",
            **{name: "" for name in STALE_PANELS},
            # What the previous run left: its downloads and its seed (which a link made during
            # the new run would otherwise carry). Its charts stay until this run's first step
            # replaces them: a chart emptied is redrawn without data (Vega's "Infinite extent"
            # warnings), and one taken off the page fails in Gradio's resize observer.
            "downloads": view.downloads_html(None, None), "run_seed": "", "record": rec}

    @takes_controls(after=("history",))
    def generate(self, c: Controls, request: gr.Request = None, history=None) -> Iterator[dict]:
        """/generate for scripts: stream a run, RUN_OUTPUTS' values; bad input raised (gradio_client
        raises it), by the parameters' names."""
        try:
            rec = self.runs.prepare(c, None, history)
        except TokenLabError as e:  # (the page said it by labels in `begin`; scripts get their parameters' names)
            raise gr.Error(str(e), print_exception=False) from None
        yield from self.runs.stream(rec, request)

    @takes_controls(after=("history",))
    def generate_on_page(self, c: Controls, request: gr.Request = None, history=None) -> Iterator[dict]:
        """`generate` for the page's own buttons. Input that `begin` refused (and said so in the
        status line) is not raised again, since gradio would mark every output "Error": it is
        repeated in a toast and every panel is kept. Scripts call /generate, which raises."""
        rec = self.runs.take(session_of(request))
        if rec is None or rec.controls != c or rec.history != (list(history or []) if c.mode == "chat" else []):
            try:  # not the run `begin` prepared (a script's click): prepared here
                rec = self.runs.prepare(c, None, history)
            except TokenLabError as e:
                gr.Warning(f"Not started: {page_message(e, one_line=True)}")  # a toast: one line
                yield {}
                return
        prepared, rec = rec, None
        try:
            for out in self.runs.stream(prepared, request):
                rec = out.get("record", rec)
                yield out
        except Exception as e:  # noqa: BLE001 - any engine error: the run ends, said in one line
            if rec is None:  # refused before it ran (this tab's run going, the visitor's share)
                raise
            # Raised on, it left the page mid-run in chromium: the toast came but after_run's
            # updates never did (the status counting, Generate off, Stop dead). Ended here, the
            # event succeeds and after_run draws the end as for any run.
            rec.error = failure_line(e, "a run")
            gr.Warning(f"The run failed: {rec.error}")
            yield {"status": f"⚠ The run failed: {rec.error}", "record": rec}

    def live_tick(self, rec: RunRecord | None, request: gr.Request = None) -> dict:
        """Twice a second while a run is on: its KV-cache and latency charts, and while no token
        has come yet the status line (waiting for the engine, or the prefill of a long prompt,
        with the time)."""
        if rec is None or rec.done is not None:  # waiting for its click to be taken, or over
            return {}
        if rec.steps:
            return charts({"kv_chart": kv_frame(rec), "latency": latency_frame(rec)})
        return {"status": self.runs.status(rec, session_of(request))}

    def after_run(self, rec: RunRecord | None, history=None, request: gr.Request = None) -> dict:
        """Once a run has ended (or was refused): the chart timer off, Generate enabled and Stop
        inactive; for a run that ended, the final charts, the step slider spanning its steps,
        the whole-run charts, the replay controls at the run's settings (an untouched replay is
        the run), the tokens of prompt and output, the downloads, the seed it used, and in chat
        mode the turn added to the conversation."""
        self.runs.waited(session_of(request))
        history = list(history or [])
        idle = {"live": gr.Timer(active=False), "generate": gr.update(interactive=True),
                "regenerate": gr.update(interactive=bool(history)),
                "stop_button": gr.update(interactive=False, variant="secondary")}
        if rec is None or rec.finished or rec.started_at is None:
            # Refused before it ran (bad input, a full queue) or already drawn: nothing to draw.
            if rec is not None and not rec.finished:
                idle["status"] = "The run did not start: see the message."
            return idle
        rec.finished, m = True, self.view(rec.model)
        # The turn is added once, to the conversation it continued.
        turn = turn_if_answered(rec, m.tokenizer.token_bytes) if history == list(rec.history) else []
        new_history = history + turn
        out = {**idle, "regenerate": gr.update(interactive=bool(new_history)), **self.runs.drawn(rec),
               "history": new_history, "conversation": conversation_html(new_history),
               "status": (view.status_text(rec, m.context, time.monotonic()) if rec.done is not None
                          else f"⚠ The run failed: {rec.error or 'see the message.'}")}
        if turn:  # a chat turn was sent: the box is ready for the next
            out["prompt"] = ""
        return out

    def preview(self, prompt, mode, system, max_new_tokens, history=None, model=None, prefix_ids="",
                rec=None) -> dict:
        """The context counter, and before the first run the tokenization view of the prompt as
        it will be fed: both from one tokenization, so that their counts agree. Once a run has
        been made the view shows that run's tokens (its title says so) until the next one."""
        text, ids = self.runs.context(prompt, mode, system, max_new_tokens, history, model, prefix_ids)
        made = rec.controls if rec is not None and rec.mode == "chat" and history else None
        if mode == "chat" and made is not None and (made.system or "") != (system or ""):
            # The template renders the whole conversation again: earlier answers are then read
            # after a system prompt they were not made under.
            text += (" · the system prompt differs from the one the last answer was made under: every "
                     "earlier turn is read after this one")
        out = {"context_count": text}
        if rec is None:
            out["tokens"] = view.run_tokens_html(self.view(model).tokenizer, ids or [], fed=False)
        return out

    @named_args(*SHAPING_SETTINGS)
    def order_view(self, *values, request: gr.Request = None) -> str:
        """The order the page's settings would run their stages in, the ones they turn on
        marked; a setting that cannot be read is named in one line."""
        try:
            return render.order_html(sampling_params(self.defaults, None, **dict(zip(SHAPING_SETTINGS, values))))
        except TokenLabError as e:
            return render.order_html(None, page_message(e, one_line=True))

    def select_step(self, rec: RunRecord | None, step) -> str:
        if rec is None or not rec.steps:
            return self._bars(None)
        return self._bars(rec.steps[step_index(rec, step)], rec=rec, pick=True)

    def select_token(self, rec: RunRecord | None, evt: gr.SelectData) -> dict:
        """Clicking a generated token (or character) shows its (first) step's bars and moves the
        slider there."""
        if rec is None or not rec.steps or evt is None or evt.index is None:
            return {}
        index = evt.index
        if isinstance(index, (list, tuple)):
            index = index[0] if index else None
        chips = view.output_chips(rec, self.view(rec.model).tokenizer)
        try:
            i = chips[min(max(int(index), 0), len(chips) - 1)].steps[0]
        except (TypeError, ValueError, OverflowError):
            return {}
        return {"bars": self._bars(rec.steps[i], rec=rec, pick=True), "step": gr.update(value=i)}

    def server_load(self) -> str:
        """The whole server's KV-cache use and queue, where the engine has one: at load, twice
        a second while a run streams, and after it."""
        if not self.caps.server_load:
            return ""
        try:
            return server_load_markdown(self.engine.server_load())
        except TokenLabError as e:
            return server_load_markdown(error=str(e))

    def stop(self, request: gr.Request | None = None) -> None:
        self.runs.stop(session_of(request))

    def stop_job(self, request: gr.Request | None = None) -> None:
        """A section's own Stop (the lens, the loom): the session's job ends within its step, and
        one clicked but not started yet (queued behind others) starts stopped; the session's next
        event (its next click) clears that, so a Stop with nothing going stops nothing later."""
        self.page.registry.stop(session_of(request), starting=True)

    def closed(self, request: gr.Request | None = None) -> None:
        """The tab was closed: its run ends, a run it still waited for no longer counts, its
        session no longer counts to its client, and its state goes after a grace period."""
        session = session_of(request)
        self.runs.stop(session)
        self.runs.forget(session)
        self.admission.sessions.forget(session)
        self.keeper.closed(session)
