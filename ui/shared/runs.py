"""Runs on the page, as every section starts and shows one: the one prepared request (prepare:
the page's controls through inference.request.prepare_run, the function every door calls), its
stream (RUN_OUTPUTS' values, under the session's one engine job), what an ended run shows, and a
run put on view again. Generate, a branch, an edit's continue, compare, the samples, the beam
search, a run from a scored text, the saved work: each prepares its run here and streams it
here, never through another section's events. One object for the page (ui/handlers.py makes
it), over its PageContext."""

from __future__ import annotations

import html
import inspect
import threading
import time
from dataclasses import replace
from typing import Iterator

import gradio as gr

from inference.errors import TokenLabError, shown
from inference.request import prepare_from_text, prepare_run
from inference.sampling.settings import BY_NAME, FILTER_SETTINGS, SHAPING_SETTINGS, decode_logit_bias
from inference.serving.engine import parse_ids
from ui.base import PageContext, session_of
from ui.controls import MODES, NAMES, Controls, parse_seed, sampling_params
from ui.format import count, token_label
from ui.run_state import FromText, Opened, RunRecord
from ui.shared import view
from ui.shared.charts import charts, entropy_frame, kv_frame, latency_frame, rank_axis, run_chart_frames
from ui.shared.downloads import Downloads
from ui.shared.kv import kv_formula, pool_markdown
from ui.streaming import EventPump, paced_interval


def raising(e: Exception) -> Iterator:
    """Events that are an error: raised when the first is asked for."""
    raise e
    yield  # (a generator)


def opened_text(opened: Opened, tok) -> str:
    """What the page says of a beam opened as a run."""
    n = len(opened.tokens)
    return (f"{opened.label.capitalize()} opened as a run: its {count(n, 'token')} {'is' if n == 1 else 'are'} "
            "given, one a step; each step's bars are the model's distribution there (the sampling settings set "
            "aside, as in the beam search).")


def from_text(point: FromText, tok) -> str:
    """What the page says of a run from a point of a scored text (Markdown: pieces as code)."""
    def piece(i: int) -> str:
        return "`" + token_label(tok.piece(i)).replace("`", "ˋ") + "`"
    said = (f"A run from {point.label or f'token {point.at + 1} of the scored ids'}: the {count(point.at, 'token')} "
            "before it are the prompt, as scored (so the mode is now completion)")
    if point.candidate is None:
        return said + (f"; the run makes what comes in the place of {piece(point.ids[point.at])}."
                       if point.at < len(point.ids) else "; the run continues after the whole text.")
    return (said + f"; {piece(point.candidate)} is put in the place of {piece(point.ids[point.at])} as if the run "
            "had written it (penalties count it) and the run continues after it.")


class Runs:
    """The page's runs: prepared once, streamed under the session's engine job; the clicks the
    engine has not yet taken (their time, a Stop that came first), the run each click prepared,
    and the beam (or the scored text's point) a session asked to open as its next run."""

    def __init__(self, page: PageContext, downloads: Downloads | None = None):
        self.page, self.downloads = page, downloads or Downloads()
        # Sessions whose run was clicked but not yet taken by the engine (their click time),
        # and those of them whose Stop came before the engine did.
        self._waiting: dict[str, float] = {}
        self._stopped_waiting: set[str] = set()
        # The run each session's click prepared (the run section's begin), run as it is.
        self._prepared: dict[str, RunRecord] = {}
        # The beam each session asked to open as a run (its next prepared click makes its tokens),
        # or the point of a scored text it asked to run from.
        self._opened: dict[str, Opened | FromText] = {}
        self._lock = threading.Lock()
        page.forgetters.append(self.forget)

    # -------------------------------------------------------- the one prepared request

    def prepare(self, c: Controls, seed: int | None, history=None, beams: bool = False,
                opened: Opened | FromText | None = None, given_in_prompt: bool = False, **override) -> RunRecord:
        """A run of the page's controls, prepared by the one function every door calls
        (inference.request.prepare_run), in an empty record ready to run. seed: the run's
        (None: the one typed, else chosen there); opened: a beam whose tokens the run makes, its
        sampling stages set aside as the beam search set them, or a point of a scored text the
        run starts from (its ids before that token the prompt, not the controls' text:
        prepare_from_text); override: settings that replace the controls' (compare's B);
        given_in_prompt: a branch's given ids are read as part of the prompt (a beam search
        continuing after them: beams take no given ids)."""
        point = opened if isinstance(opened, FromText) else None
        opened = opened if isinstance(opened, Opened) else None
        if c.mode not in MODES:
            raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {shown(c.mode)}")
        if opened is not None:
            override = {**override, **{n: BY_NAME[n].neutral for n in FILTER_SETTINGS}, "num_beams": 1}
        params = sampling_params(c, seed, **override)  # every control that cannot be used, named at once
        if seed is None:  # the one typed (checked above), else prepare_run chooses it
            params = replace(params, seed=parse_seed(c.seed))
        if opened is not None:
            params = replace(params, stop=())  # the beam's tokens, all of them (a beam search has no stops)
        chat, m = c.mode == "chat" and point is None, self.page.view(c.model)
        made = opened or point
        if made is not None and made.model != m.label:
            raise TokenLabError(f"the beam search ran on {made.model}, not on {m.label}: pick that model or run the "
                                "beam search again" if opened is not None else
                                f"the text was scored on {made.model}, not on {m.label}: pick that model or score "
                                "the text again")
        if chat and isinstance(c.prompt, str) and not c.prompt.strip():  # the API's may be empty; here a slip
            raise TokenLabError("the message is empty: type what you say to the model")
        turns = list(history or []) if chat else []
        given, ids = parse_ids(c.prefix_ids, "prefix ids"), None
        if given_in_prompt and given:  # the prompt as fed, then the given ids, as one prompt
            ids, given = [*m.engine.prompt(c.prompt, chat, c.system, turns)[1], *given], []
        run = dict(top_n=self.page.top_n, token_cap=self.page.limits.max_new_tokens)
        if point is not None:
            request = prepare_from_text(m.engine, params, list(point.ids), point.at, candidate=point.candidate, **run)
        else:
            request = prepare_run(m.engine, params, prompt=c.prompt if ids is None else None, ids=ids, chat=chat,
                                  system=c.system, history=turns, given=given,
                                  forced=opened.tokens if opened else (), **run)
        if opened is not None and request.ids != list(opened.prompt_ids):
            raise TokenLabError("the prompt changed since the beam search: run the beam search again to open its beams")
        if request.params.num_beams > 1 and not beams:
            raise TokenLabError("Beams is above 1: run the beam search with \"Run beam search\" in the decoding "
                                "section, or set Beams to 1 to sample")
        given, tok = list(request.given), m.tokenizer
        prompt_text = request.prompt_text if point is None else point.text
        if prompt_text is None:  # ids (a beam search's after given ids): their text, after the BOS the view adds
            prompt_ids = list(request.prompt_ids)
            prompt_text = tok.decode(prompt_ids[1:] if prompt_ids[:1] == [tok.bos_id] else prompt_ids)
        return RunRecord(m.label, prompt_text, list(request.prompt_ids), seed=request.seed,
                         given=given, given_text=tok.continuation_text(given),
                         params=request.params, bias=dict(decode_logit_bias(request.params.logit_bias, tok)),
                         mode="completion" if point is not None else c.mode, user_message=c.prompt,
                         system=c.system or "", history=turns, max_steps=request.max_new,
                         controls=c, kv_bytes_per_token=m.info.kv_bytes_per_position, request=request,
                         opened=opened_text(opened, tok) if opened else from_text(point, tok) if point else "")

    # -------------------------------------------------------- a click not yet taken by the engine

    def hold(self, session: str, rec: RunRecord) -> None:
        """A click's prepared run, waiting for the engine: streamed as it is (take)."""
        rec.queued_at = time.monotonic()
        with self._lock:
            self._waiting[session] = rec.queued_at
            self._prepared[session] = rec
            self._stopped_waiting.discard(session)

    def take(self, session: str) -> RunRecord | None:
        """The run the session's click prepared (None: none is waiting)."""
        with self._lock:
            return self._prepared.pop(session, None)

    def open_next(self, session: str, opened: Opened | FromText) -> None:
        """The session's next prepared click makes a beam's tokens, or starts from a point of a
        scored text (prepare's `opened`)."""
        with self._lock:
            self._opened[session] = opened

    def take_opened(self, session: str) -> Opened | FromText | None:
        with self._lock:
            return self._opened.pop(session, None)

    def waited(self, session: str) -> None:
        """The session's click was answered (its run ended, or was refused): it waits no more."""
        with self._lock:
            self._waiting.pop(session, None)

    def stop(self, session: str) -> None:
        """Stop: the session's run ends within a step; one still waiting ends as soon as it starts."""
        with self._lock:
            if session in self._waiting:
                self._stopped_waiting.add(session)
        self.page.registry.stop(session)

    def forget(self, session: str) -> None:
        """The session's state was deleted (server/sessions.py), or its tab closed: a click of it
        that the engine never took is not kept for ever."""
        with self._lock:
            self._waiting.pop(session, None)
            self._prepared.pop(session, None)
            self._opened.pop(session, None)
            self._stopped_waiting.discard(session)

    def status(self, rec: RunRecord, session: str) -> str:
        """The status line of a run waiting for the engine: what is ahead of it."""
        with self._lock:
            mine = self._waiting.get(session)
            before = sum(1 for s, t in self._waiting.items() if s != session and mine is not None and t < mine)
        m = self.page.view(rec.model)
        return view.status_text(rec, m.context, time.monotonic(), (m.engine.active_runs, before))

    # -------------------------------------------------------- streaming a prepared run

    def stream(self, rec: RunRecord, request: gr.Request = None) -> Iterator[dict]:
        """Stream a prepared run under the session's one engine job: RUN_OUTPUTS' values."""
        session = session_of(request)
        with self._lock:
            queued_at = self._waiting.pop(session, None)
            stopped = session in self._stopped_waiting
            self._stopped_waiting.discard(session)
        rec.queued_at, rec.started_at = queued_at, time.monotonic()
        rec.owner = getattr(request, "username", None) or None
        with self.page.job(request) as cancel:
            if stopped:  # Stop was pressed while the run waited: it ends before its first token
                cancel.set()
            yield from self._events(rec, cancel)

    def _events(self, rec: RunRecord, cancel) -> Iterator[dict]:
        notice, m = rec.opened, self.page.view(rec.model)
        n = len(rec.prompt_ids) + len(rec.given)
        room = m.context - n
        if rec.params.max_new_tokens > room and not rec.request.forced:  # (a beam's tokens are its length)
            notice = " ".join(filter(None, (notice, f"Max new tokens lowered from {rec.params.max_new_tokens} to "
                                                    f"{room}: the prompt uses {n} of the {m.context}-token context window.")))
        try:
            events = m.engine.run(rec.request, cancel)
        except Exception as e:  # noqa: BLE001 - a server's engine refuses at once (it is no generator):
            events = raising(e)  # the run fails after its first update, as one refused mid-way does
        pump = EventPump(events, cancel)
        try:
            yield self.outputs(rec, notice)
            for batch in pump.batches(lambda: paced_interval(m.update_interval_s, m.engine.active_runs)):
                for ev in batch:
                    rec.add(ev)
                yield self.outputs(rec, notice)  # the last one carries the complete text
        finally:
            pump.close()

    def outputs(self, rec: RunRecord, notice: str = "") -> dict:
        """RUN_OUTPUTS' values for the run so far.

        Only what changes with every token streams here, and every value is sent: a gr.skip()
        costs more than a small value, as Gradio rebuilds the component on the server. The
        prompt's view and the charts, larger and slower to change, come from the click, the
        chart timer (twice a second while the run streams) and the run's end. The output's
        popovers (each token's alternatives) come with the last update only.

        The values are sent as they are (the run's events have postprocess=False): Gradio's
        own postprocessing, one thread hop per component per update, cost ~0.9 ms of CPU an
        update and took the GIL from the engine's thread. The Markdown ones are dedented here,
        as Gradio's Markdown would.
        """
        last, m = rec.steps[-1] if rec.steps else None, self.page.view(rec.model)
        tok = m.tokenizer
        waiting = ("Waiting for the server…" if rec.waiting is not None else
                   f"Reading the prompt: prefill of {count(len(rec.prompt_ids), 'token')}…")
        return {
            "output": view.output_html(rec, tok, empty=waiting),
            "bars": self.page.bars(last, rec=rec, pick=True),
            "stats": inspect.cleandoc(view.stats_markdown(m.info, rec)),
            "kv_text": inspect.cleandoc(self.kv_text(rec)),
            "notice": inspect.cleandoc(notice),  # the wait, if any, is on the status line
            "status": inspect.cleandoc(view.status_text(rec, m.context, time.monotonic())),
            "step": last.step if last else 0,
            "api_tokens": view.output_tokens(rec, tok) if rec.done is not None else [],
            "record": rec,
        }

    def kv_text(self, rec: RunRecord) -> str:
        """The KV-cache formula with this run's positions held (the prompt and every token but
        the newest): measured where the engine measures them, else counted by the formula."""
        last = rec.steps[-1] if rec.steps else None
        positions = len(rec.prompt_ids) + len(rec.steps) - 1 if last else None
        return (kv_formula(self.page.view(rec.model).info, positions, last.kv_cache_bytes if last else None)
                + pool_markdown(last))

    # -------------------------------------------------------- an ended run, and one put on view again

    def drawn(self, rec: RunRecord) -> dict:
        """What an ended run shows besides its streamed panels: the final charts, the step slider
        spanning its steps, the whole-run charts, the replay controls at its settings (an
        untouched replay is the run), the tokens of prompt and output, the downloads and its seed."""
        n, tok = len(rec.steps), self.page.view(rec.model).tokenizer
        run_chart, rank_chart = run_chart_frames(rec)
        return {**charts({"kv_chart": kv_frame(rec), "latency": latency_frame(rec), "run_chart": run_chart,
                          "entropy_chart": entropy_frame(rec)}),
                **({} if rank_chart is None else {"rank_chart": gr.update(value=rank_chart, y_lim=rank_axis(rank_chart))}),
                "step": gr.update(minimum=0, maximum=max(n - 1, 1), value=max(n - 1, 0), interactive=n > 1),
                **{f"replay_{name}": getattr(rec.params, name) for name in SHAPING_SETTINGS},
                "tokens": view.run_tokens_html(tok, rec.prompt_ids, [s.token_id for s in rec.steps],
                                               given_ids=rec.given),
                "downloads": view.downloads_html(*self.downloads.of_run(rec)),
                "run_seed": "" if rec.seed is None else str(rec.seed)}

    def show(self, rec: RunRecord) -> dict:
        """An ended run put on view again (text, bars, statistics, charts, tokens, downloads) and
        the controls set to it, so that a link made now restores it (outputs.SHOWN's names)."""
        n = len(rec.steps)
        out = {name: v for name, v in self.outputs(rec).items() if name != "api_tokens"}
        out.update(self.drawn(rec))
        out.update({"step": gr.update(minimum=0, maximum=max(n - 1, 1), value=max(n - 1, 0), interactive=n > 1),
                    "prompt_view": gr.update(value=view.fed_text(self.page.view(rec.model).tokenizer, rec),
                                             visible=True),
                    **({} if rec.controls is None else dict(zip(NAMES, rec.controls.values()))),
                    "seed": str(rec.seed)})
        return out

    # -------------------------------------------------------- the prompt as it will be fed

    def context(self, prompt, mode, system, max_new_tokens, history=None, model=None,
                prefix_ids="") -> tuple[str, list[int] | None]:
        """The context counter's line and the prompt's ids as they will be fed (None: they
        cannot be): the prompt's tokens (in chat mode with the template and the earlier turns),
        the given ids, the most new tokens / the context window, in the chosen model."""
        chat = mode == "chat"
        turns = list(history or []) if chat else []
        if isinstance(prompt, str) and not prompt.strip():
            if turns:
                n = len(turns) // 2
                return f"Context: {n} earlier turn{'s' * (n != 1)} kept · type your next message", None
            return "Context: the prompt is empty", None
        try:
            m = self.page.view(model)
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
        return view.context_text(len(ids), None, max_new, m.context, len(given)), ids

    def count_context(self, prompt, mode, system, max_new_tokens, history=None, model=None, prefix_ids="") -> str:
        """The context counter's line alone."""
        return self.context(prompt, mode, system, max_new_tokens, history, model, prefix_ids)[0]
