"""What the page's events do. One class whose methods are plain functions tests can call; the
engine and the run registry are passed in."""

from __future__ import annotations

import functools
import inspect
import secrets
from contextlib import contextmanager
from typing import Iterator

import gradio as gr

from inference.engine import Engine
from inference.errors import ServerError, TokenLabError, shown
from inference.settings import FILTER_SETTINGS
from ui import render, render_remote
from ui.controls import (MODES, NAMES, Controls, controls_from_query, parse_seed, parse_stop,
                         sampling_params, share_url)
from ui.run_state import RunRecord, divergence
from ui.public import Admission, Limits, Refused, client_key, tokens_message
from ui.streaming import EventPump, RunRegistry, update_interval_for


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


def takes_controls(*extra: str):
    """The page passes each control as one argument, in Controls order, then `extra` values and
    gradio's request; the method receives them as one Controls. The signature names every
    argument: gradio takes /generate's parameter names from it."""
    def wrap(fn):
        n, m = len(NAMES), len(extra)

        def split(args):
            return Controls(*args[:n]), args[n:n + m], (args[n + m] if len(args) > n + m else None)

        if inspect.isgeneratorfunction(fn):  # gradio streams only from generator functions
            def method(self, *args):
                c, more, request = split(args)
                yield from fn(self, c, *more, request=request)
        else:
            def method(self, *args):
                c, more, request = split(args)
                return fn(self, c, *more, request=request)
        functools.update_wrapper(method, fn)
        del method.__wrapped__  # gradio must see the signature below, not fn's
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        method.__signature__ = inspect.Signature(
            [inspect.Parameter(p, kind) for p in ("self", *NAMES, *extra)]
            + [inspect.Parameter("request", kind, default=None, annotation=gr.Request)])
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
    """A RemoteEngine: the page in front of a model server (inference/remote.py)."""
    return getattr(engine, "is_remote", False)


class Handlers:
    """The engine and the run registry, passed in; each method is one page event. The engine is
    a local Engine or a RemoteEngine (same methods); `view` formats what depends on which."""

    def __init__(self, engine: Engine, registry: RunRegistry | None = None, top_n: int = 10,
                 update_interval_s: float | None = None, limits: Limits | None = None):
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

    @takes_controls()
    def generate(self, c: Controls, request: gr.Request = None) -> Iterator[tuple]:
        """Stream a run. Yields the values of `outputs`."""
        try:
            rec = self._prepare(c, _seed_or_random(c.seed))
        except TokenLabError as e:
            raise _page_error(e) from None
        with self._job(request) as cancel:
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
            for batch in stream.batches(self.update_interval_s):
                for ev in batch:
                    rec.add(ev)
                yield self.outputs(rec, notice)  # the last one carries the complete text
        finally:
            stream.close()

    def outputs(self, rec: RunRecord, notice: str = "") -> tuple:
        """Values for: output, bars, stats, KV formula, notice, run state.

        Only what changes with every token streams here, and every value is sent: a gr.skip()
        costs more than a small value, as Gradio rebuilds the component on the server. The
        prompt's view and the charts, larger and slower to change, come from `begin`,
        `live_charts` (twice a second while the run streams) and `after_run`.
        """
        last = rec.steps[-1] if rec.steps else None
        return (
            render.highlighted_output(rec, self.engine.tokenizer),
            self._bars(last),
            self.view.stats_markdown(self.info, rec),
            self._kv_text(rec),
            "\n\n".join(t for t in (render.wait_markdown(rec), notice) if t),
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

    @takes_controls()
    def begin(self, c: Controls, request: gr.Request = None) -> tuple:
        """At the click, before the run is queued: the prompt as fed and its tokens, empty
        charts, and the chart timer on. Bad input shows nothing here; `generate` reports it.
        A session with a job going, or a client at its share, is refused here, before the run
        is queued (the page then does not queue it)."""
        session, client = _who(request)
        self.registry.settle(session)  # a run just stopped ends within a step
        refusal = self.admission.refusal(session, client)
        if refusal is not None:
            raise gr.Error(refusal, print_exception=False)
        try:
            rec = self._prepare(c, 0)
            tokens = render.prompt_tokens_html(self.engine.tokenizer, rec.prompt_ids)
        except TokenLabError:  # a server that does not answer: generate says so
            rec = RunRecord()
            tokens = render.prompt_tokens_html(self.engine.tokenizer, [])
        empty = RunRecord()
        return (rec.prompt_text, tokens, render.kv_frame(empty), render.latency_frame(empty),
                gr.Timer(active=True))

    def live_charts(self, rec: RunRecord | None) -> tuple:
        """The KV-cache and latency charts of the running run (a timer tick while it streams)."""
        if rec is None or rec.done is not None:  # still the previous run's record, or over
            return gr.skip(), gr.skip()
        return render.kv_frame(rec), render.latency_frame(rec)

    def after_run(self, rec: RunRecord | None) -> tuple:
        """Once a run has ended: the chart timer off, the final KV-cache and latency charts, the
        step slider spanning the run's steps, and the whole-run charts."""
        rec = rec or RunRecord()
        n = len(rec.steps)
        step = gr.update(maximum=max(n - 1, 1), value=max(n - 1, 0), interactive=n > 1)
        return (gr.Timer(active=False), render.kv_frame(rec), render.latency_frame(rec), step,
                *render.run_chart_frames(rec))

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
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        chips = render.output_chips(rec, self.engine.tokenizer)
        i = chips[min(int(index), len(chips) - 1)].steps[0]
        return self._bars(rec.steps[i]), gr.update(value=i)

    # -------------------------------------------------------- inside one token

    def inspect_step(self, rec: RunRecord | None, step, layer, request: gr.Request = None) -> tuple[str, str, str]:
        """Stages with shapes and costs, attention heatmap and logit lens for the selected step."""
        if rec is None or not rec.steps:
            raise gr.Error("Generate first, then pick a step to look inside.", print_exception=False)
        i = _step_index(rec, step)
        layer = min(max(int(layer or 0), 0), self.info.cfg.n_layers - 1) if self.info.cfg else 0
        with self._job(request):
            try:
                capture = self.engine.capture(rec.seen_before(i), layer)
            except TokenLabError as e:  # in front of a server: no activations to capture
                raise _page_error(e) from None
        tok = self.engine.tokenizer
        return (render.stages_markdown(self.info, len(rec.prompt_ids), i),
                render.attention_html(capture, tok), render.lens_html(capture, tok))

    # -------------------------------------------------------- sampling experiments

    @named_args("rec", "step", *FILTER_SETTINGS)
    def replay_step(self, rec: RunRecord | None, step, *values, request: gr.Request = None) -> tuple[str, str]:
        """The step's sampling pipeline as it ran and under new settings (values: one per
        settings.FILTER_SETTINGS), on the step's logits recomputed by one forward pass (kept
        for the next replay of the same step)."""
        if rec is None or not rec.steps:
            raise gr.Error("Generate first, then pick a step to replay.", print_exception=False)
        i = _step_index(rec, step)
        ev = rec.steps[i]
        try:
            new = sampling_params(self.defaults, None, **dict(zip(FILTER_SETTINGS, values)))
        except TokenLabError as e:
            raise _page_error(e) from None
        seen = rec.seen_before(i)
        with self._job(request):  # one forward pass, unless this step's logits are kept
            try:
                logits = rec.logits_at(i, self.engine.step_logits)
            except TokenLabError as e:  # in front of a server: no whole logit vector
                raise _page_error(e) from None
        ran, final_ran = self.engine.replay(logits, rec.params, seen, ev.token_id)
        again, final_again = self.engine.replay(logits, new, seen, ev.token_id)
        tok = self.engine.tokenizer
        return (f"**Step {i}**, every token of the vocabulary through each stage; the step's "
                "logits recomputed by one forward pass over its context.\n\n"
                + render.stages_table(ran, again, tok, ev.token_id),
                render.replay_bars(ev, final_ran, final_again, tok))

    def _prepare(self, c: Controls, seed: int, **override) -> RunRecord:
        """Validate the controls and tokenize the prompt: an empty record ready to run."""
        if c.mode not in MODES:
            raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {shown(c.mode)}")
        params = sampling_params(c, seed, **override)
        cap = self.limits.max_new_tokens
        if cap is not None and params.max_new_tokens > cap:
            raise TokenLabError(tokens_message(cap, params.max_new_tokens))
        chat = c.mode == "chat"
        ids = self.engine.prompt_ids(c.prompt, chat, c.system)
        return RunRecord(self.engine.prompt_text(c.prompt, chat, c.system), ids, seed=seed, params=params,
                         kv_bytes_per_token=render_remote.kv_bytes_per_token(self.info) if self.remote else None)

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
            raise gr.Error("Generate first, then pick the position to score from.", print_exception=False)
        i = _step_index(rec, step)
        try:
            with self._job(request):
                scores = self.engine.score(rec.seen_before(i), text or "")
        except TokenLabError as e:
            raise _page_error(e) from None
        return f"After the prompt and the first {i} generated tokens:\n\n" + render.likelihood_table(scores)

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
        self.registry.stop(_session(request))

    def closed(self, request: gr.Request | None = None) -> None:
        """The tab was closed: its run ends, and its session no longer counts to its client."""
        self.stop(request)
        self.admission.sessions.forget(_session(request))

    # -------------------------------------------------------- sharing

    def restore(self, request: gr.Request | None = None) -> tuple:
        """Controls from the page URL's query parameters; bad values are named in the notice."""
        query = dict(getattr(request, "query_params", {}) or {})
        c, problems = controls_from_query(query, Controls(**vars(self.defaults)))
        cap = self.limits.max_new_tokens
        if cap is not None and c.max_new_tokens > cap:
            problems.append(f"Max new tokens lowered from {c.max_new_tokens} to {cap}: {tokens_message(cap)}")
            c.max_new_tokens = cap
        return (*c.values(), "\n".join(problems))

    @takes_controls("base")
    def share_link(self, c: Controls, base: str, request: gr.Request = None) -> str:
        """A link that restores these settings; `base` is the page's own address."""
        try:  # text that no run could use makes no link (and is not copied into one)
            self.engine.check_prompt_size(c.prompt, c.mode == "chat", c.system)
            parse_stop(c.stop)
            parse_seed(c.seed)
            if c.mode not in MODES:
                raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {shown(c.mode)}")
        except TokenLabError as e:
            raise _page_error(e) from None
        base = base if isinstance(base, str) and len(base) <= MAX_URL_CHARS else ""
        return share_url(base, c, self.defaults)


def _step_index(rec: RunRecord, step) -> int:
    return min(max(int(step or 0), 0), len(rec.steps) - 1)
