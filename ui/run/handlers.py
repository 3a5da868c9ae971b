"""The run section's events: a run from the click to its end (also the /generate API), the
status line while it waits, the step shown in the bars, the context counter, and the downloads."""

from __future__ import annotations

import contextvars
import dataclasses
import html
import inspect
import json
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import gradio as gr

from inference.device import available_memory_bytes
from inference.errors import TokenLabError, shown
from inference.loading import progress
from inference.request import prepare_run
from inference.serving.engine import parse_ids
from inference.sampling.settings import BY_NAME, FILTER_SETTINGS, SHAPING_SETTINGS, decode_logit_bias
from ui.base import PageContext, Section, failure_line, named_args, session_of, step_index, takes_controls
from ui.chat import conversation_html, turn_if_answered
from ui.format import count
from ui.controls import MODES, NAMES, Controls, page_message, parse_seed, sampling_params
from ui.experiments.render import entropy_frame, rank_axis, run_chart_frames
from ui.inside.render import memory_markdown
from ui.run import kv, render
from ui.run_state import Opened, RunRecord, run_jsonl
from ui.streaming import EventPump, paced_interval
from ui.widgets import line_colors

# What a run streams, in /generate's output order: output, bars, statistics, KV formula,
# notice, status, step slider, the tokens (for API clients, complete in the last update), the
# run's record.
RUN_OUTPUTS = ("output", "bars", "stats", "kv_text", "notice", "status", "step", "api_tokens", "record")
# Panels that show results about the previous run; a new run clears them.
STALE_PANELS = ("replay_md", "replay_bars", "x_md", "stages_md", "attention", "lens", "pattern")
KEEP_FILES = 200
LOAD_TICK_S = 0.5  # how often the status line says a first load's stage and time
NOT_STARTED = "⚠ Not started:"  # begin's status for input it refused
DOWNLOAD_ROUTE = "tokenlab/download"  # the downloads' addresses, relative to the page (layout.launch)


def charts(frames: dict) -> dict:
    """The charts that have data: one without (line_frame's None) keeps what it shows, never
    emptied (see begin)."""
    return {name: frame for name, frame in frames.items() if frame is not None}


def raising(e: Exception) -> Iterator:
    """Events that are an error: raised when the first is asked for."""
    raise e
    yield  # (a generator)


class RunHandlers(Section):
    """A run: prepared at the click (begin), streamed (generate_on_page, /generate), stopped, its
    steps and downloads; and the model picker, the prompt's preview and the server's load."""

    def __init__(self, page: PageContext, files_dir: str | None = None):
        super().__init__(page)
        # Sessions whose run was clicked but not yet taken by the engine (their click time),
        # and those of them whose Stop came before the engine did.
        self._waiting: dict[str, float] = {}
        self._stopped_waiting: set[str] = set()
        # The run each session's click prepared (begin), for the page's generate to run as it is.
        self._prepared: dict[str, object] = {}
        # The beam each session asked to open as a run: its next run (begin) makes that beam's tokens.
        self._opened: dict[str, Opened] = {}
        self._lock = threading.Lock()
        # Downloads the page offers: written here, the oldest deleted once there are more than KEEP_FILES.
        self._files_dir = Path(files_dir or tempfile.mkdtemp(prefix="tokenlab-downloads-"))
        self._files: deque[str] = deque()  # tokens, oldest first
        self._file_paths: dict[str, Path] = {}
        page.forgetters.append(self._forget)

    def _forget(self, session: str) -> None:
        """The session's state was deleted (server/sessions.py): a click of it that the engine never
        took (a run cancelled while it waited, in a tab that vanished without its unload) is
        not kept for ever."""
        with self._lock:
            self._waiting.pop(session, None)
            self._prepared.pop(session, None)
            self._opened.pop(session, None)
            self._stopped_waiting.discard(session)

    def open_next(self, session: str, opened: Opened) -> None:
        """The session's next run (its begin, chained after this) makes a beam's tokens."""
        with self._lock:
            self._opened[session] = opened

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
        session = self.admit(request)
        with self._lock:
            opened = self._opened.pop(session, None)  # a beam to open: this run only
        try:
            # every control that cannot be used, named as the page labels it
            rec = self.prepare(c, None, history, opened=opened)
        except TokenLabError as e:
            return {"status": f"{NOT_STARTED} {page_message(e)}"}
        rec.queued_at = time.monotonic()
        with self._lock:
            self._waiting[session] = rec.queued_at
            self._prepared[session] = rec  # what generate_on_page runs: the run is prepared once
            self._stopped_waiting.discard(session)
        rec = dataclasses.replace(rec, seed=None)  # (shown once the run has it)
        return {
            "prompt_view": gr.update(value=render.fed_text(self.view(rec.model).tokenizer, rec), visible=True),
            "tokens": render.run_tokens_html(self.view(rec.model).tokenizer, rec.prompt_ids),
            "live": gr.Timer(active=True),
            "generate": gr.update(interactive=False), "regenerate": gr.update(interactive=False),
            "stop_button": gr.update(interactive=True, variant="stop"),
            "step": gr.update(minimum=0, maximum=max(rec.max_steps - 1, 1), value=0, interactive=False),
            "status": self._status(rec, session),
            "output": render.output_html(None, None, empty="Waiting for the engine…"),
            "bars": self._bars(None), "stats": "Waiting for the engine…", "notice": "",
            **{name: "" for name in STALE_PANELS},
            # What the previous run left: its downloads and its seed (which a link made during
            # the new run would otherwise carry). Its charts stay until this run's first step
            # replaces them: a chart emptied is redrawn without data (Vega's "Infinite extent"
            # warnings), and one taken off the page fails in Gradio's resize observer.
            "downloads": render.downloads_html(None, None), "run_seed": "", "record": rec}

    @takes_controls(after=("history",))
    def generate(self, c: Controls, request: gr.Request = None, history=None) -> Iterator[dict]:
        """Stream a run: RUN_OUTPUTS' values, as `outputs` gives them."""
        try:
            rec = self.prepare(c, None, history)
        except TokenLabError as e:  # (the page said it by labels in `begin`; scripts get their parameters' names)
            raise gr.Error(str(e), print_exception=False) from None
        yield from self._generate(rec, request)

    def _generate(self, rec: RunRecord, request: gr.Request = None) -> Iterator[dict]:
        """Stream a prepared run: RUN_OUTPUTS' values."""
        session = session_of(request)
        with self._lock:
            queued_at = self._waiting.pop(session, None)
            stopped = session in self._stopped_waiting
            self._stopped_waiting.discard(session)
        rec.queued_at, rec.started_at = queued_at, time.monotonic()
        with self._job(request) as cancel:
            if stopped:  # Stop was pressed while the run waited: it ends before its first token
                cancel.set()
            yield from self._stream(rec, cancel)

    def _stream(self, rec: RunRecord, cancel) -> Iterator[dict]:
        notice, m = rec.opened, self.view(rec.model)
        n = len(rec.prompt_ids) + len(rec.given)
        room = m.context - n
        if rec.params.max_new_tokens > room and not rec.opened:
            notice = (f"Max new tokens lowered from {rec.params.max_new_tokens} to {room}: the prompt "
                      f"uses {n} of the {m.context}-token context window.")
        try:
            events = m.engine.run(rec.request, cancel)
        except Exception as e:  # noqa: BLE001 - a server's engine refuses at once (it is no generator):
            events = raising(e)  # the run fails after its first update, as one refused mid-way does
        stream = EventPump(events, cancel)
        try:
            yield self.outputs(rec, notice)
            for batch in stream.batches(lambda: paced_interval(m.update_interval_s, m.engine.active_runs)):
                for ev in batch:
                    rec.add(ev)
                yield self.outputs(rec, notice)  # the last one carries the complete text
        finally:
            stream.close()

    @takes_controls(after=("history",))
    def generate_on_page(self, c: Controls, request: gr.Request = None, history=None) -> Iterator[dict]:
        """`generate` for the page's own buttons. Input that `begin` refused (and said so in the
        status line) is not raised again, since gradio would mark every output "Error": it is
        repeated in a toast and every panel is kept. Scripts call /generate, which raises."""
        with self._lock:
            rec = self._prepared.pop(session_of(request), None)
        if rec is None or rec.controls != c or rec.history != (list(history or []) if c.mode == "chat" else []):
            try:  # not the run `begin` prepared (a script's click): prepared here
                rec = self.prepare(c, None, history)
            except TokenLabError as e:
                gr.Warning(f"Not started: {page_message(e, one_line=True)}")  # a toast: one line
                yield {}
                return
        prepared, rec = rec, None
        try:
            for out in self._generate(prepared, request):
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

    def outputs(self, rec: RunRecord, notice: str = "") -> dict:
        """RUN_OUTPUTS' values for the run so far.

        Only what changes with every token streams here, and every value is sent: a gr.skip()
        costs more than a small value, as Gradio rebuilds the component on the server. The
        prompt's view and the charts, larger and slower to change, come from `begin`,
        `live_tick` (twice a second while the run streams) and `after_run`. The output's
        popovers (each token's alternatives) come with the last update only.

        The values are sent as they are (the run's events have postprocess=False): Gradio's
        own postprocessing, one thread hop per component per update, cost ~0.9 ms of CPU an
        update and took the GIL from the engine's thread. The Markdown ones are dedented here,
        as Gradio's Markdown would.
        """
        last, m = rec.steps[-1] if rec.steps else None, self.view(rec.model)
        tok = m.tokenizer
        waiting = ("Waiting for the server…" if rec.waiting is not None else
                   f"Reading the prompt: prefill of {count(len(rec.prompt_ids), 'token')}…")
        return {
            "output": render.output_html(rec, tok, empty=waiting),
            "bars": self._bars(last, rec=rec, pick=True),
            "stats": inspect.cleandoc(render.stats_markdown(m.info, rec)),
            "kv_text": inspect.cleandoc(self._kv_text(rec)),
            "notice": inspect.cleandoc(notice),  # the wait, if any, is on the status line
            "status": inspect.cleandoc(render.status_text(rec, m.context, time.monotonic())),
            "step": last.step if last else 0,
            "api_tokens": render.output_tokens(rec, tok) if rec.done is not None else [],
            "record": rec,
        }

    def _kv_text(self, rec: RunRecord) -> str:
        """The KV-cache formula with this run's positions held (the prompt and every token but
        the newest): measured where the engine measures them, else counted by the formula."""
        last = rec.steps[-1] if rec.steps else None
        positions = len(rec.prompt_ids) + len(rec.steps) - 1 if last else None
        return (kv.kv_formula(self.view(rec.model).info, positions, last.kv_cache_bytes if last else None)
                + kv.pool_markdown(last))

    def _status(self, rec: RunRecord, session: str) -> str:
        with self._lock:
            mine = self._waiting.get(session)
            before = sum(1 for s, t in self._waiting.items() if s != session and mine is not None and t < mine)
        m = self.view(rec.model)
        return render.status_text(rec, m.context, time.monotonic(), (m.engine.active_runs, before))

    def live_tick(self, rec: RunRecord | None, request: gr.Request = None) -> dict:
        """Twice a second while a run is on: its KV-cache and latency charts, and while no token
        has come yet the status line (waiting for the engine, or the prefill of a long prompt,
        with the time)."""
        if rec is None or rec.done is not None:  # waiting for its click to be taken, or over
            return {}
        if rec.steps:
            return charts({"kv_chart": kv.kv_frame(rec), "latency": kv.latency_frame(rec)})
        return {"status": self._status(rec, session_of(request))}

    def chart_colors(self, rec: RunRecord | None) -> dict:
        """The colours of the run's charts with more than one line, after their data (line_colors)."""
        if rec is None:
            return {}
        ended = rec.done is not None
        return {"kv_chart": line_colors(kv.kv_frame(rec), "series", ended),
                "run_chart": line_colors(run_chart_frames(rec)[0], "metric", ended)}

    def after_run(self, rec: RunRecord | None, history=None, request: gr.Request = None) -> dict:
        """Once a run has ended (or was refused): the chart timer off, Generate enabled and Stop
        inactive; for a run that ended, the final charts, the step slider spanning its steps,
        the whole-run charts, the replay controls at the run's settings (an untouched replay is
        the run), the tokens of prompt and output, the downloads, the seed it used, and in chat
        mode the turn added to the conversation."""
        with self._lock:
            self._waiting.pop(session_of(request), None)
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
        out = {**idle, "regenerate": gr.update(interactive=bool(new_history)), **self.drawn(rec),
               "history": new_history, "conversation": conversation_html(new_history),
               "status": (render.status_text(rec, m.context, time.monotonic()) if rec.done is not None
                          else f"⚠ The run failed: {rec.error or 'see the message.'}")}
        if turn:  # a chat turn was sent: the box is ready for the next
            out["prompt"] = ""
        return out

    def drawn(self, rec: RunRecord) -> dict:
        """What an ended run shows besides its streamed panels: the final charts, the step slider
        spanning its steps, the whole-run charts, the replay controls at its settings (an
        untouched replay is the run), the tokens of prompt and
        output, the downloads and its seed."""
        n, tok = len(rec.steps), self.view(rec.model).tokenizer
        run_chart, rank_chart = run_chart_frames(rec)
        return {**charts({"kv_chart": kv.kv_frame(rec), "latency": kv.latency_frame(rec), "run_chart": run_chart,
                          "entropy_chart": entropy_frame(rec)}),
                **({} if rank_chart is None else {"rank_chart": gr.update(value=rank_chart, y_lim=rank_axis(rank_chart))}),
                "step": gr.update(minimum=0, maximum=max(n - 1, 1), value=max(n - 1, 0), interactive=n > 1),
                **{f"replay_{name}": getattr(rec.params, name) for name in SHAPING_SETTINGS},
                "tokens": render.run_tokens_html(tok, rec.prompt_ids, [s.token_id for s in rec.steps],
                                                 given_ids=rec.given),
                "downloads": render.downloads_html(
                    self._write_file(f"run-{rec.seed}.jsonl", run_jsonl(rec)),
                    self._write_file(f"settings-{rec.seed}.json", self._settings_json(rec))),
                "run_seed": "" if rec.seed is None else str(rec.seed)}

    def _settings_json(self, rec: RunRecord) -> str:
        """The run's settings, as the page's controls (and the link's query) name them, with the
        seed it used and the model that made it, by name (the picker's "" says nothing in a file:
        a link naming the default model opens it as the default); in chat mode also the earlier
        turns it continued."""
        c = rec.controls or Controls()
        data = {**dict(zip(NAMES, c.values())), "model": rec.model, "seed": "" if rec.seed is None else str(rec.seed)}
        if rec.mode == "chat":
            data["history"] = list(rec.history)
        return json.dumps(data, ensure_ascii=False, indent=1) + "\n"

    def _write_file(self, name: str, text: str) -> str:
        """Write a download and return its address, relative to the page: DOWNLOAD_ROUTE, a
        random token and the name. Only files written here are served (download_path); the
        oldest are deleted once there are more than KEEP_FILES."""
        token = secrets.token_hex(16)
        d = self._files_dir / token
        d.mkdir(parents=True, exist_ok=True)
        path = d / name
        path.write_text(text, encoding="utf-8")
        with self._lock:
            self._files.append(token)
            self._file_paths[token] = path
            old = [self._files.popleft() for _ in range(max(0, len(self._files) - KEEP_FILES))]
            for t in old:
                self._file_paths.pop(t, None)
        for t in old:
            shutil.rmtree(self._files_dir / t, ignore_errors=True)
        return f"{DOWNLOAD_ROUTE}/{token}/{name}"

    def download_path(self, token: str, name: str) -> Path | None:
        """The file a download address names, if this page wrote it (and still keeps it)."""
        with self._lock:
            path = self._file_paths.get(token)
        return path if path is not None and path.name == name and path.exists() else None

    def count_context(self, prompt, mode, system, max_new_tokens, history=None, model=None, prefix_ids="") -> str:
        """The context counter while typing: the prompt's tokens (in chat mode with the template
        and the earlier turns), the given ids, the most new tokens / the context window, in the
        chosen model."""
        return self._context(prompt, mode, system, max_new_tokens, history, model, prefix_ids)[0]

    def preview(self, prompt, mode, system, max_new_tokens, history=None, model=None, prefix_ids="",
                rec=None) -> dict:
        """The context counter, and before the first run the tokenization view of the prompt as
        it will be fed: both from one tokenization, so that their counts agree. Once a run has
        been made the view shows that run's tokens (its title says so) until the next one."""
        text, ids = self._context(prompt, mode, system, max_new_tokens, history, model, prefix_ids)
        made = rec.controls if rec is not None and rec.mode == "chat" and history else None
        if mode == "chat" and made is not None and (made.system or "") != (system or ""):
            # The template renders the whole conversation again: earlier answers are then read
            # after a system prompt they were not made under.
            text += (" · the system prompt differs from the one the last answer was made under: every "
                     "earlier turn is read after this one")
        out = {"context_count": text}
        if rec is None:
            out["tokens"] = render.run_tokens_html(self.view(model).tokenizer, ids or [], fed=False)
        return out

    def _context(self, prompt, mode, system, max_new_tokens, history=None, model=None,
                 prefix_ids="") -> tuple[str, list[int] | None]:
        """The counter's line and the prompt's ids as they will be fed (None: they cannot be)."""
        chat = mode == "chat"
        turns = list(history or []) if chat else []
        if isinstance(prompt, str) and not prompt.strip():
            if turns:
                n = len(turns) // 2
                return f"Context: {n} earlier turn{'s' * (n != 1)} kept · type your next message", None
            return "Context: the prompt is empty", None
        try:
            m = self.view(model)
            ids = m.engine.prompt_ids(prompt, chat, system, turns)
        except TokenLabError as e:
            return f"Context: {html.escape(str(e))}", None
        try:
            max_new = BY_NAME["max_new_tokens"].parse(max_new_tokens)
        except TokenLabError:
            max_new = None
        try:
            given = parse_ids(prefix_ids, "the given ids")
        except TokenLabError as e:
            return f"Context: {html.escape(str(e))}", ids
        return render.context_text(len(ids), None, max_new, m.context, len(given)), ids

    # -------------------------------------------------------- the model picker

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
            out["status"] = render.status_text(rec, self.view(label).context, time.monotonic())
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
        cannot fit is refused, said under the picker), then the model card, its memory, the
        KV-cache formula, the context counter, the system prompt's default and the sliders'
        ranges follow it. A status saying why a run did not start is about the model before:
        it goes (Generate checks again); a run's own status stays."""
        try:
            m = self.view(model)
        except TokenLabError as e:
            return {"model_md": self.models_markdown(f"{e}")}
        cap = self.limits.max_new_tokens
        most = m.context - 1 if cap is None else min(m.context - 1, cap)
        cfg = m.info.cfg
        out = {"model_md": self.models_markdown(), "model_card": render.model_card(m.info),
               "memory": memory_markdown(m.info), "kv_text": kv.kv_formula(m.info),
               "context_count": self.count_context(prompt, mode, system, max_new_tokens, history, model),
               "max_new_tokens": gr.update(maximum=most),
               "system": gr.update(placeholder=m.default_system or "none"),
               "mode": gr.update(**render.mode_choice(m.info))}
        if str(status or "").startswith(NOT_STARTED):
            out["status"] = ""
        if cfg is not None:
            out["layer"] = gr.update(maximum=cfg.n_layers - 1, value=cfg.n_layers - 1)
            out["head"] = gr.update(maximum=cfg.n_heads - 1, value=0)
        return out

    # -------------------------------------------------------- the sampler order

    @named_args(*SHAPING_SETTINGS)
    def order_view(self, *values, request: gr.Request = None) -> str:
        """The order the page's settings would run their stages in, the ones they turn on
        marked; a setting that cannot be read is named in one line."""
        try:
            return render.order_html(sampling_params(self.defaults, None, **dict(zip(SHAPING_SETTINGS, values))))
        except TokenLabError as e:
            return render.order_html(None, page_message(e, one_line=True))

    # -------------------------------------------------------- selecting a step after the run

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
        chips = render.output_chips(rec, self.view(rec.model).tokenizer)
        try:
            i = chips[min(max(int(index), 0), len(chips) - 1)].steps[0]
        except (TypeError, ValueError, OverflowError):
            return {}
        return {"bars": self._bars(rec.steps[i], rec=rec, pick=True), "step": gr.update(value=i)}

    def prepare(self, c: Controls, seed: int | None, history=None, beams: bool = False,
                opened: Opened | None = None, given_in_prompt: bool = False, **override) -> RunRecord:
        """A run of the page's controls, prepared by the one function every door calls
        (inference.request.prepare_run), in an empty record ready to run. seed: the run's
        (None: the one typed, else chosen there); opened: a beam whose tokens the run makes, its
        sampling stages set aside as the beam search set them; override: settings that replace
        the controls' (compare's B); given_in_prompt: a branch's given ids are read as part of the
        prompt (a beam search continuing after them: beams take no given ids)."""
        if c.mode not in MODES:
            raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {shown(c.mode)}")
        if opened is not None:
            override = {**override, **{n: BY_NAME[n].neutral for n in FILTER_SETTINGS}, "num_beams": 1}
        params = sampling_params(c, seed, **override)  # every control that cannot be used, named at once
        if seed is None:  # the one typed (checked above), else prepare_run chooses it
            params = replace(params, seed=parse_seed(c.seed))
        if opened is not None:
            params = replace(params, stop=())  # the beam's tokens, all of them (a beam search has no stops)
        chat, m = c.mode == "chat", self.view(c.model)
        if opened is not None and opened.model != m.label:
            raise TokenLabError(f"the beam search ran on {opened.model}, not on {m.label}: pick that model or run "
                                "the beam search again")
        if chat and isinstance(c.prompt, str) and not c.prompt.strip():  # the API's may be empty; here a slip
            raise TokenLabError("the message is empty: type what you say to the model")
        turns = list(history or []) if chat else []
        given, ids = parse_ids(c.prefix_ids, "prefix ids"), None
        if given_in_prompt and given:  # the prompt as fed, then the given ids, as one prompt
            ids, given = [*m.engine.prompt(c.prompt, chat, c.system, turns)[1], *given], []
        request = prepare_run(m.engine, params, prompt=c.prompt if ids is None else None, ids=ids, chat=chat,
                              system=c.system, history=turns, given=given, top_n=self.top_n,
                              token_cap=self.limits.max_new_tokens, forced=opened.tokens if opened else ())
        if opened is not None and request.ids != list(opened.prompt_ids):
            raise TokenLabError("the prompt changed since the beam search: run the beam search again to open its beams")
        if request.params.num_beams > 1 and not beams:
            raise TokenLabError("Beams is above 1: run the beam search with \"Run beam search\" in the decoding "
                                "section, or set Beams to 1 to sample")
        given = list(request.given)
        said = (f"{opened.label.capitalize()} opened as a run: its {count(len(opened.tokens), 'token')} "
                f"{'is' if len(opened.tokens) == 1 else 'are'} given, one a step; "
                "each step's bars are the model's distribution there (the sampling settings set aside, as in the "
                "beam search).") if opened else ""
        return RunRecord(m.label, request.prompt_text, list(request.prompt_ids), seed=request.seed,
                         given=given, given_text=m.tokenizer.continuation_text(given),
                         params=request.params, bias=dict(decode_logit_bias(request.params.logit_bias, m.tokenizer)),
                         mode=c.mode, user_message=c.prompt, system=c.system or "",
                         history=turns, max_steps=request.max_new,
                         controls=c, kv_bytes_per_token=m.info.kv_bytes_per_position, request=request,
                         opened=said)

    # -------------------------------------------------------- the server's own load

    def server_load(self) -> str:
        """The whole server's KV-cache use and queue, where the engine has one: at load, twice
        a second while a run streams, and after it."""
        if not self.caps.server_load:
            return ""
        try:
            return kv.server_load_markdown(self.engine.server_load())
        except TokenLabError as e:
            return kv.server_load_markdown(error=str(e))

    # -------------------------------------------------------- stop, closed tabs

    def stop(self, request: gr.Request | None = None) -> None:
        session = session_of(request)
        with self._lock:
            if session in self._waiting:  # not yet running: it ends as soon as it starts
                self._stopped_waiting.add(session)
        self.registry.stop(session)

    def closed(self, request: gr.Request | None = None) -> None:
        """The tab was closed: its run ends, a run it still waited for no longer counts, its
        session no longer counts to its client, and its state goes after a grace period."""
        session = session_of(request)
        self.stop(request)
        with self._lock:
            self._waiting.pop(session, None)
            self._prepared.pop(session, None)
            self._stopped_waiting.discard(session)
        self.admission.sessions.forget(session)
        self.keeper.closed(session)
