"""What the page's events do. One class whose methods are plain functions tests can call; the
engine and the run registry are passed in."""

from __future__ import annotations

import functools
import html
import inspect
import json
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import gradio as gr

from inference.serving.engine import Engine
from inference.errors import ServerError, TokenLabError, shown
from inference.sampling.settings import BY_NAME, FILTER_SETTINGS
from ui import render, render_remote
from ui.controls import (MODES, NAMES, Controls, controls_from_query, parse_seed, parse_stop,
                         sampling_params, share_url)
from ui.public import Admission, Limits, Refused, client_key, tokens_message
from ui.run_state import RunRecord, divergence, run_jsonl, turn_messages
from ui.streaming import EventPump, RunRegistry, paced_interval, update_interval_for


MAX_URL_CHARS = 2048  # the page's own address, sent by the browser for the share link


def named_args(*names: str):
    """The method takes a value for each of `names` (the last ones as *values), then gradio's
    request; the signature names them all, so that gradio passes the request (it finds it only
    among named parameters)."""
    def wrap(fn):
        n = len(names)

        def method(self, *args):
            return fn(self, *args[:n], request=args[n] if len(args) > n else None)
        functools.update_wrapper(method, fn)
        del method.__wrapped__
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        method.__signature__ = inspect.Signature(
            [inspect.Parameter(p, kind) for p in ("self", *names)]
            + [inspect.Parameter("request", kind, default=None, annotation=gr.Request)])
        return method
    return wrap


def takes_controls(*extra: str, after: tuple[str, ...] = ()):
    """The page passes each control as one argument, in Controls order, then `extra` values,
    gradio's request, then `after` values (session state a script does not pass: gradio puts
    the request where the signature has it); the method receives the controls as one Controls
    and the `after` values by keyword. The signature names every argument: gradio takes
    /generate's parameter names from it."""
    def wrap(fn):
        n, m = len(NAMES), len(extra)

        def split(args):
            request = args[n + m] if len(args) > n + m else None
            return Controls(*args[:n]), args[n:n + m], request, dict(zip(after, args[n + m + 1:]))

        if inspect.isgeneratorfunction(fn):  # gradio streams only from generator functions
            def method(self, *args):
                c, more, request, late = split(args)
                yield from fn(self, c, *more, request=request, **late)
        else:
            def method(self, *args):
                c, more, request, late = split(args)
                return fn(self, c, *more, request=request, **late)
        functools.update_wrapper(method, fn)
        del method.__wrapped__  # gradio must see the signature below, not fn's
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        method.__signature__ = inspect.Signature(
            [inspect.Parameter(p, kind) for p in ("self", *NAMES, *extra)]
            + [inspect.Parameter("request", kind, default=None, annotation=gr.Request)]
            + [inspect.Parameter(p, kind, default=None) for p in after])
        return method
    return wrap


def _page_error(e: TokenLabError) -> gr.Error:
    return gr.Error(str(e), print_exception=False)


def _seed_or_random(text) -> int:
    """The seed typed, or a random one: either way the run knows, and shows, its seed."""
    seed = parse_seed(text)
    return secrets.randbelow(2**31) if seed is None else seed


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"


def _who(request: gr.Request | None) -> tuple[str, str]:
    """(session, client) of a page event; client as ui.public.client_key names it."""
    return _session(request), client_key(request)


def is_remote(engine) -> bool:
    """A RemoteEngine: the page in front of a model server (inference/remote/engine.py)."""
    return getattr(engine, "is_remote", False)


class Handlers:
    """The engine and the run registry, passed in; each method is one page event. The engine is
    a local Engine or a RemoteEngine (same methods); `view` formats what depends on which.
    Events that run outside the queue (queue=False) never raise: gradio answers those with an
    HTTP 500, so they return their message in the panel instead."""

    def __init__(self, engine: Engine, registry: RunRegistry | None = None, top_n: int = 10,
                 update_interval_s: float | None = None, limits: Limits | None = None,
                 files_dir: str | None = None):
        """limits: what one visitor may cost (ui/public.py); none by default."""
        self.engine, self.registry, self.top_n = engine, registry or RunRegistry(), top_n
        self.limits = limits or Limits()
        self.admission = Admission(self.registry, self.limits)
        self.info = engine.describe()
        cap = self.limits.max_new_tokens
        self.remote = is_remote(engine)
        self.view = render_remote if self.remote else render
        self.context = self.info.max_seq_len if self.remote else self.info.cfg.max_seq_len
        # The line under each step's bars: where the numbers come from, or how approximate they are.
        self.bars_note = (render_remote.bars_source(self.info, top_n) if self.remote
                          else render.approx_note(self.info))
        self.defaults = Controls.for_model(engine.generation_defaults)
        if cap is not None and self.defaults.max_new_tokens > cap:
            self.defaults.max_new_tokens = cap
        self.update_interval_s = update_interval_s or update_interval_for(engine)
        self.default_system = getattr(engine, "default_system_prompt", "") or ""
        # Sessions whose run was clicked but not yet taken by the engine (their click time),
        # and those of them whose Stop came before the engine did.
        self._waiting: dict[str, float] = {}
        self._stopped_waiting: set[str] = set()
        self._lock = threading.Lock()
        # Downloads the page offers: written here (in the system's temp directory, which gradio
        # serves from), the oldest deleted once there are more than KEEP_FILES.
        self._files_dir = Path(files_dir or tempfile.mkdtemp(prefix="tokenlab-downloads-"))
        self._files: deque[str] = deque()  # tokens, oldest first
        self._file_paths: dict[str, Path] = {}

    @contextmanager
    def _job(self, request: gr.Request | None):
        """Hold the session's one engine job while the body runs; yields its cancel flag. A
        session with a job going, or a client at its share, is refused with a page error."""
        session, client = _who(request)
        try:
            cancel = self.registry.start(session, client, self.limits.runs_per_client)
        except Refused as e:
            raise gr.Error(str(e), print_exception=False) from None
        try:
            yield cancel
        finally:
            self.registry.finish(session, cancel)

    # -------------------------------------------------------- a run (also the /generate API)

    @takes_controls(after=("history",))
    def begin(self, c: Controls, request: gr.Request = None, history=None) -> tuple:
        """At the click, before the run is queued. Values for BEGIN_OUTPUTS.

        Valid input: the prompt as fed and its tokens, every panel of the previous run cleared
        (output, bars, statistics, charts, replay, likelihood, inside one token) and its
        downloads, whole-run charts and seed reset (RESET_AT_BEGIN), Generate
        disabled and Stop enabled, the step slider spanning the steps to come, the chart timer
        on, and a waiting record (the status line says what the run waits for). Bad input: the
        error in the status line and every panel kept as it was; `generate` refuses it too.
        A session with a job going, or a client at its share, is refused here with a page error
        (begin runs in the queue, unlimited, so that this is no HTTP 500), and the run is not
        queued."""
        session, client = _who(request)
        self.registry.settle(session)  # a run just stopped ends within a step
        refusal = self.admission.refusal(session, client)
        if refusal is not None:
            raise gr.Error(refusal, print_exception=False)
        try:
            parse_seed(c.seed)
            rec = self._prepare(c, 0, history)
        except TokenLabError as e:
            return (*[gr.skip()] * 4, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(),
                    f"⚠ Not started: {e}", *[gr.skip()] * 4, *[gr.skip()] * len(STALE_PANELS),
                    *[gr.skip()] * len(RESET_AT_BEGIN), gr.skip())
        rec.seed, rec.queued_at = None, time.monotonic()
        with self._lock:
            self._waiting[session] = rec.queued_at
            self._stopped_waiting.discard(session)
        empty = RunRecord()
        slider = gr.update(minimum=0, maximum=max(rec.max_steps - 1, 1), value=0, interactive=False)
        return (rec.prompt_text, render.run_tokens_html(self.engine.tokenizer, rec.prompt_ids),
                render.kv_frame(empty), render.latency_frame(empty), gr.Timer(active=True),
                gr.update(interactive=False), gr.update(interactive=False),
                gr.update(interactive=True, variant="stop"), slider,
                self._status(rec, session), render.output_html(None, None, empty="Waiting for the engine…"),
                self._bars(None), "Waiting for the engine…", "", *[""] * len(STALE_PANELS), *_reset_values(), rec)

    @takes_controls(after=("history",))
    def generate(self, c: Controls, request: gr.Request = None, history=None) -> Iterator[tuple]:
        """Stream a run. Yields the values of `outputs`."""
        session = _session(request)
        with self._lock:
            queued_at = self._waiting.pop(session, None)
            stopped = session in self._stopped_waiting
            self._stopped_waiting.discard(session)
        try:
            rec = self._prepare(c, _seed_or_random(c.seed), history)
        except TokenLabError as e:
            raise _page_error(e) from None
        rec.queued_at, rec.started_at = queued_at, time.monotonic()
        with self._job(request) as cancel:
            if stopped:  # Stop was pressed while the run waited: it ends before its first token
                cancel.set()
            yield from self._stream(rec, cancel)

    def _stream(self, rec: RunRecord, cancel) -> Iterator[tuple]:
        notice = ""
        n, room = len(rec.prompt_ids), self.context - len(rec.prompt_ids)
        if rec.params.max_new_tokens > room:
            notice = (f"Max new tokens lowered from {rec.params.max_new_tokens} to {room}: the prompt "
                      f"uses {n} of the {self.context}-token context window.")
        stream = EventPump(self.engine.generate_ids(rec.prompt_ids, rec.params, self.top_n, cancel), cancel)
        try:
            yield self.outputs(rec, notice)
            for batch in stream.batches(lambda: paced_interval(self.update_interval_s, self.engine.active_runs)):
                for ev in batch:
                    rec.add(ev)
                yield self.outputs(rec, notice)  # the last one carries the complete text
        finally:
            stream.close()

    @takes_controls(after=("history",))
    def generate_on_page(self, c: Controls, request: gr.Request = None, history=None) -> Iterator[tuple]:
        """`generate` for the page's own buttons. Input that `begin` refused (and said so in the
        status line) is not raised again, since gradio would mark every output "Error": it is
        repeated in a toast and every panel is kept. Scripts call /generate, which raises."""
        try:
            parse_seed(c.seed)
            self._prepare(c, 0, history)
        except TokenLabError as e:
            gr.Warning(f"Not started: {e}")
            yield (gr.skip(),) * RUN_OUTPUTS
            return
        yield from self.generate(*c.values(), request, history)

    def outputs(self, rec: RunRecord, notice: str = "") -> tuple:
        """Values for: output, bars, stats, KV formula, notice, status, step slider, the tokens
        (for API clients, complete in the last update), run state.

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
        last = rec.steps[-1] if rec.steps else None
        tok = self.engine.tokenizer
        return (
            render.output_html(rec, tok, empty=("Waiting for the server…" if rec.waiting is not None else
                                                f"Reading the prompt: prefill of {len(rec.prompt_ids):,} tokens…")),
            self._bars(last),
            inspect.cleandoc(self.view.stats_markdown(self.info, rec)),
            inspect.cleandoc(self._kv_text(rec)),
            inspect.cleandoc(notice),  # the wait, if any, is on the status line
            inspect.cleandoc(render.status_text(rec, self.context, time.monotonic())),
            last.step if last else 0,
            render.output_tokens(rec, tok) if rec.done is not None else [],
            rec,
        )

    def _bars(self, step, title: str = "") -> str:
        return render.bars_html(step, title, self.bars_note)

    def _kv_text(self, rec: RunRecord) -> str:
        """The KV-cache formula with this run's positions held (the prompt and every token but
        the newest): measured by the local engine, counted in front of a server, whose own
        numbers are the whole server's (server_load)."""
        last = rec.steps[-1] if rec.steps else None
        if self.remote:
            return render_remote.kv_formula(self.info, len(rec.prompt_ids) + len(rec.steps) - 1 if last else None)
        return render.kv_formula(self.info, last.kv_cache_bytes if last else None) + render.pool_markdown(last)

    def _status(self, rec: RunRecord, session: str) -> str:
        with self._lock:
            mine = self._waiting.get(session)
            before = sum(1 for s, t in self._waiting.items() if s != session and mine is not None and t < mine)
        return render.status_text(rec, self.context, time.monotonic(), (self.engine.active_runs, before))

    def live_charts(self, rec: RunRecord | None) -> tuple:
        """The KV-cache and latency charts of the running run (a timer tick while it streams)."""
        if rec is None or rec.done is not None or not rec.steps:  # waiting, or over: nothing new
            return gr.skip(), gr.skip()
        return render.kv_frame(rec), render.latency_frame(rec)

    def live_tick(self, rec: RunRecord | None, request: gr.Request = None) -> tuple:
        """Twice a second while a run is on: its charts, and while no token has come yet the
        status line (waiting for the engine, or the prefill of a long prompt, with the time)."""
        if rec is None or rec.done is not None or rec.steps:
            return (*self.live_charts(rec), gr.skip())
        return gr.skip(), gr.skip(), self._status(rec, _session(request))

    def after_run(self, rec: RunRecord | None, history=None, request: gr.Request = None) -> tuple:
        """Once a run has ended (or was refused): values for AFTER_OUTPUTS. The chart timer off,
        Generate enabled and Stop inactive; for a run that ended, the final charts, the step
        slider spanning its steps, the whole-run charts, the replay controls at the run's
        settings (an untouched replay is the run), the tokens of prompt and output, the
        downloads, the seed it used, and in chat mode the turn added to the conversation."""
        with self._lock:
            self._waiting.pop(_session(request), None)
        history = list(history or [])
        idle = (gr.Timer(active=False), gr.update(interactive=True),
                gr.update(interactive=bool(history)), gr.update(interactive=False, variant="secondary"))
        if rec is None or rec.finished or rec.started_at is None:
            # Refused before it ran (bad input, a full queue) or already drawn: nothing to draw.
            status = (gr.skip() if rec is None or rec.finished
                      else "The run did not start: see the message.")
            return (*idle, *[gr.skip()] * (len(AFTER_OUTPUTS) - 5), status)
        rec.finished = True
        n = len(rec.steps)
        step = gr.update(minimum=0, maximum=max(n - 1, 1), value=max(n - 1, 0), interactive=n > 1)
        # The turn is added once, to the conversation it continued.
        turn = _turn_if_answered(rec) if history == list(rec.history) else []
        new_history = history + turn
        idle = (idle[0], idle[1], gr.update(interactive=bool(new_history)), idle[3])
        p = rec.params
        replay_values = [getattr(p, name) for name in FILTER_SETTINGS]
        status = (render.status_text(rec, self.context, time.monotonic()) if rec.done is not None
                  else "The run failed: see the message.")
        return (*idle, render.kv_frame(rec), render.latency_frame(rec), step, *render.run_chart_frames(rec),
                *replay_values,
                render.run_tokens_html(self.engine.tokenizer, rec.prompt_ids, [s.token_id for s in rec.steps]),
                render.downloads_html(self._write_file(f"run-{rec.seed}.jsonl", run_jsonl(rec)),
                                      self._write_file(f"settings-{rec.seed}.json", self._settings_json(rec))),
                "" if rec.seed is None else str(rec.seed),
                new_history, render.conversation_html(new_history),
                "" if turn else gr.skip(),  # a chat turn was sent: the box is ready for the next
                status)

    def _settings_json(self, rec: RunRecord) -> str:
        """The run's settings, as the page's controls (and the link's query) name them, with the
        seed it used; in chat mode also the earlier turns it continued."""
        c = rec.controls or Controls()
        data = {**dict(zip(NAMES, c.values())), "seed": "" if rec.seed is None else str(rec.seed)}
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

    def count_context(self, prompt, mode, system, max_new_tokens, history=None) -> str:
        """The context counter while typing: the prompt's tokens (in chat mode with the template
        and the earlier turns) + the most new tokens / the context window."""
        chat = mode == "chat"
        turns = list(history or []) if chat else []
        try:
            ids = self.engine.prompt_ids(prompt, chat, system, turns)
        except TokenLabError as e:
            if isinstance(prompt, str) and not prompt.strip():
                if turns:
                    return f"Context: {len(turns) // 2} earlier turn(s) kept · type your next message"
                return "Context: the prompt is empty"
            return f"Context: {html.escape(str(e))}"
        try:
            max_new = BY_NAME["max_new_tokens"].parse(max_new_tokens)
        except TokenLabError:
            max_new = None
        return render.context_text(len(ids), None, max_new, self.context)

    # -------------------------------------------------------- selecting a step after the run

    def select_step(self, rec: RunRecord | None, step) -> str:
        if rec is None or not rec.steps:
            return self._bars(None)
        return self._bars(rec.steps[_step_index(rec, step)])

    def select_token(self, rec: RunRecord | None, evt: gr.SelectData):
        """Clicking a generated token (or character) shows its (first) step's bars and moves the
        slider there."""
        if rec is None or not rec.steps or evt is None or evt.index is None:
            return gr.update(), gr.update()
        index = evt.index
        if isinstance(index, (list, tuple)):
            index = index[0] if index else None
        chips = render.output_chips(rec, self.engine.tokenizer)
        try:
            i = chips[min(max(int(index), 0), len(chips) - 1)].steps[0]
        except (TypeError, ValueError, OverflowError):
            return gr.update(), gr.update()
        return self._bars(rec.steps[i]), gr.update(value=i)

    # -------------------------------------------------------- inside one token

    @named_args("rec", "step", "layer", "head")
    def inspect_step(self, rec: RunRecord | None, step, layer, head=0, request: gr.Request = None
                     ) -> tuple[str, str, str, str]:
        """Stages with shapes and costs, the new token's attention, the logit lens and the full
        attention pattern of one head, for the selected step and layer (one forward pass, kept
        for the next head of the same step and layer)."""
        if rec is None or not rec.steps:
            return ("Generate first, then pick a step to look inside.", "", "", "")
        i = _step_index(rec, step)
        try:
            layer = min(max(int(layer or 0), 0), self.info.cfg.n_layers - 1) if self.info.cfg else 0
        except (TypeError, ValueError):
            return ("The layer must be a whole number.", "", "", "")
        with self._job(request):
            try:
                capture, pattern = rec.capture_at(i, layer, lambda ids: (self.engine.capture(ids, layer),
                                                                         self.engine.attention_pattern(ids, layer)))
            except TokenLabError as e:  # in front of a server: no activations to capture
                return (f"⚠ {e}", "", "", "")
        tok = self.engine.tokenizer
        return (render.stages_markdown(self.info, len(rec.prompt_ids), i),
                render.attention_html(capture, tok), render.lens_html(capture, tok),
                self._pattern(capture.context_ids, pattern, layer, head))

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

    # -------------------------------------------------------- sampling experiments

    @named_args("rec", "step", *FILTER_SETTINGS)
    def replay_step(self, rec: RunRecord | None, step, *values, request: gr.Request = None) -> tuple[str, str]:
        """The step's sampling pipeline as it ran and under new settings (values: one per
        settings.FILTER_SETTINGS), on the step's logits recomputed by one forward pass (kept
        for the next replay of the same step, so moving a replay control is cheap)."""
        if rec is None or not rec.steps:
            return "Generate first, then pick a step to replay.", ""
        i = _step_index(rec, step)
        ev = rec.steps[i]
        try:
            new = sampling_params(self.defaults, None, **dict(zip(FILTER_SETTINGS, values)))
        except TokenLabError as e:
            return f"⚠ Replay: {e}", ""
        seen = rec.seen_before(i)
        with self._job(request):  # one forward pass, unless this step's logits are kept
            try:
                logits = rec.logits_at(i, self.engine.step_logits)
            except TokenLabError as e:  # in front of a server: no whole logit vector
                return f"⚠ Replay: {e}", ""
        ran, final_ran = self.engine.replay(logits, rec.params, seen, ev.token_id)
        again, final_again = self.engine.replay(logits, new, seen, ev.token_id)
        tok = self.engine.tokenizer
        return (f"**Step {i}**, every token of the vocabulary through each stage; the step's "
                "logits recomputed by one forward pass over its context.\n\n"
                + render.stages_table(ran, again, tok, ev.token_id),
                render.replay_bars(ev, final_ran, final_again, tok))

    def _prepare(self, c: Controls, seed: int, history=None, **override) -> RunRecord:
        """Validate the controls and tokenize the prompt: an empty record ready to run."""
        if c.mode not in MODES:
            raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {shown(c.mode)}")
        params = sampling_params(c, seed, **override)
        cap = self.limits.max_new_tokens
        if cap is not None and params.max_new_tokens > cap:
            raise TokenLabError(tokens_message(cap, params.max_new_tokens))
        chat = c.mode == "chat"
        turns = list(history or []) if chat else []
        ids = self.engine.prompt_ids(c.prompt, chat, c.system, turns)
        return RunRecord(self.engine.prompt_text(c.prompt, chat, c.system, turns), ids, seed=seed,
                         params=params, mode=c.mode, user_message=c.prompt, system=c.system or "",
                         history=turns, max_steps=min(params.max_new_tokens, self.context - len(ids)),
                         controls=c, kv_bytes_per_token=(render_remote.kv_bytes_per_token(self.info)
                                                         if self.remote else None))

    def _collect(self, rec: RunRecord, cancel) -> RunRecord:
        for ev in self.engine.generate_ids(rec.prompt_ids, rec.params, self.top_n, cancel):
            rec.add(ev)
        return rec

    @takes_controls(*(f"{name}_b" for name in FILTER_SETTINGS))
    def compare(self, c: Controls, *b_values, request: gr.Request = None):
        """Run A (the page's settings) and B (the compare settings) with the same prompt and seed."""
        try:
            chosen = _seed_or_random(c.seed)
            ra, rb = self._prepare(c, chosen), self._prepare(c, chosen, **dict(zip(FILTER_SETTINGS, b_values)))
            with self._job(request) as cancel:
                ra, rb = self._collect(ra, cancel), self._collect(rb, cancel)
        except TokenLabError as e:
            raise _page_error(e) from None
        at = divergence(ra, rb)
        bars = (self._bars(ra.steps[at], f"A at step {at}") if at is not None and at < len(ra.steps) else "",
                self._bars(rb.steps[at], f"B at step {at}") if at is not None and at < len(rb.steps) else "")
        return (render.highlighted_with_marker(ra, at), render.highlighted_with_marker(rb, at),
                render.compare_summary(ra, rb, at) + f"\n\nSeed {chosen} for both.", *bars)

    def likelihood(self, rec: RunRecord | None, step, text: str, request: gr.Request = None) -> str:
        """How likely was this text? Teacher-forced at the selected step's position."""
        if rec is None or not rec.steps:
            return "Generate first, then pick the position to score from."
        i = _step_index(rec, step)
        try:
            with self._job(request):
                scores = self.engine.score(rec.seen_before(i), text or "")
        except TokenLabError as e:
            raise _page_error(e) from None
        return f"After the prompt and the first {i} generated tokens:\n\n" + render.likelihood_table(scores)

    # -------------------------------------------------------- chat turns

    def pop_last_turn(self, history):
        """Regenerate: the last answer dropped, its user message back in the prompt box (the
        run then starts as for Generate). Queued, so that a refusal is a message, not an HTTP
        error, and the run does not start."""
        history = list(history or [])
        if len(history) < 2 or history[-1].get("role") != "assistant":
            raise gr.Error("There is no answer to regenerate: send a message in chat mode first.",
                           print_exception=False)
        rest = history[:-2]
        return rest, history[-2]["content"], "chat", render.conversation_html(rest)

    def new_conversation(self) -> tuple:
        return [], render.conversation_html([]), gr.update(interactive=False)

    # -------------------------------------------------------- the server's own load

    def server_load(self) -> str:
        """The whole server's KV-cache use and queue (its /metrics), in front of a server: at
        load, twice a second while a run streams, and after it."""
        if not self.remote:
            return ""
        try:
            return render_remote.server_load_markdown(self.engine.server_load())
        except ServerError as e:
            return render_remote.server_load_markdown(error=str(e))

    # -------------------------------------------------------- stop, closed tabs

    def stop(self, request: gr.Request | None = None) -> None:
        session = _session(request)
        with self._lock:
            if session in self._waiting:  # not yet running: it ends as soon as it starts
                self._stopped_waiting.add(session)
        self.registry.stop(session)

    def closed(self, request: gr.Request | None = None) -> None:
        """The tab was closed: its run ends, a run it still waited for no longer counts, and its
        session no longer counts to its client."""
        self.stop(request)
        with self._lock:
            self._waiting.pop(_session(request), None)
        self.admission.sessions.forget(_session(request))

    # -------------------------------------------------------- sharing

    def restore(self, request: gr.Request | None = None) -> tuple:
        """Controls from the page URL's query parameters; each ignored parameter is named on a
        line of its own in the notice (the last value). Also opens "More settings" when the link
        sets one."""
        query = dict(getattr(request, "query_params", {}) or {})
        c, problems = controls_from_query(query, Controls(**vars(self.defaults)),
                                          {"max_new_tokens": self.context - 1})
        cap = self.limits.max_new_tokens
        if cap is not None and c.max_new_tokens > cap:
            problems.append(f"Max new tokens lowered from {c.max_new_tokens} to {cap}: {tokens_message(cap)}")
            c.max_new_tokens = cap
        notice = ("**Some link parameters were ignored** (their controls keep the defaults):\n\n"
                  + "\n".join(f"- {p}" for p in problems)) if problems else ""
        more = any(getattr(c, n) != getattr(self.defaults, n) for n in MORE_SETTINGS)
        return (*c.values(), gr.update(open=True) if more else gr.skip(), notice)

    @takes_controls("base", after=("run_seed",))
    def share_link(self, c: Controls, base: str, request: gr.Request = None, run_seed: str = "") -> str:
        """A link that restores these settings; `base` is the page's own address, `run_seed`
        the seed the last run used (it stands in for an empty seed box)."""
        try:  # text that no run could use makes no link (and is not copied into one)
            self.engine.check_prompt_size(c.prompt, c.mode == "chat", c.system)
            parse_stop(c.stop)
            parse_seed(c.seed)
            if c.mode not in MODES:
                raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {shown(c.mode)}")
        except TokenLabError as e:
            raise _page_error(e) from None
        base = base if isinstance(base, str) and len(base) <= MAX_URL_CHARS else ""
        run_seed = run_seed if isinstance(run_seed, str) and run_seed.isdigit() and len(run_seed) < 20 else None
        return share_url(base, c, self.defaults, seed=run_seed)


# The controls in "More settings" (closed unless a link sets one of them).
MORE_SETTINGS = ("min_p", "repetition_penalty", "stop")
# Panels that show results about the previous run; a new run clears them (layout's order).
STALE_PANELS = ("replay_md", "replay_bars", "x_md", "stages_md", "attention", "lens", "pattern")
# What the previous run left that a new run resets to its empty state (after STALE_PANELS, in
# this order): its downloads, its whole-run charts, and its seed (which a link made during the
# new run would otherwise carry).
RESET_AT_BEGIN = ("downloads", "run_chart", "rank_chart", "run_seed")
# after_run's outputs, in order (layout wires the components in this order).
AFTER_OUTPUTS = ("live", "generate", "regenerate", "stop", "kv_chart", "latency", "step", "run_chart",
                 "rank_chart", *(f"replay_{n}" for n in FILTER_SETTINGS), "tokens", "downloads",
                 "run_seed", "history", "conversation", "prompt", "status")
KEEP_FILES = 200
DOWNLOAD_ROUTE = "tokenlab/download"  # the downloads' addresses, relative to the page (layout.launch)
RUN_OUTPUTS = 9  # len(Handlers.outputs(...))


def _reset_values() -> tuple:
    """RESET_AT_BEGIN's empty values."""
    return (render.downloads_html(None, None), *render.run_chart_frames(RunRecord()), "")


def _turn_if_answered(rec: RunRecord) -> list[dict]:
    """The chat turn to keep: a stopped run that produced nothing adds none."""
    turn = turn_messages(rec)
    if turn and rec.done.reason == "cancelled" and not rec.done.text:
        return []
    return turn


def _step_index(rec: RunRecord, step) -> int:
    """The step asked for, within the run (anything that is not a number: step 0)."""
    try:
        i = int(float(step or 0))
    except (TypeError, ValueError, OverflowError):
        i = 0
    return min(max(i, 0), len(rec.steps) - 1)
