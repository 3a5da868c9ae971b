"""What the page's events do. Plain functions and one small class: tests call them directly."""

from __future__ import annotations

import math
import queue
import secrets
import threading
import time
from dataclasses import dataclass, fields
from typing import Iterator
from urllib.parse import urlencode

import gradio as gr

from inference.engine import Engine
from inference.errors import TokenLabError
from inference.events import DoneEvent
from inference.sampling import SamplingParams
from ui import format as fmt

CHART_INTERVAL_S = 0.5  # the charts, larger to send and draw, at most twice a second
MODES = ("completion", "chat")


@dataclass
class Controls:
    """The page's inputs, in the order the layout passes them (also the URL query keys)."""
    prompt: str = "The capital of France is"
    mode: str = "completion"
    system: str = ""
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 64
    seed: str = ""
    stop: str = ""

    @classmethod
    def for_model(cls, generation_defaults: dict) -> "Controls":
        """The page's defaults, with the model's generation_config.json where it has one."""
        c = cls()
        for name in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens"):
            if name in generation_defaults:
                setattr(c, name, type(getattr(c, name))(generation_defaults[name]))
        return c

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def values(self) -> list:
        return [getattr(self, n) for n in self.names()]


def parse_seed(text) -> int | None:
    if text is None or str(text).strip() == "":
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise TokenLabError(f"seed must be a whole number or empty (random), got {text!r}") from None
    if not 0 <= value < 2**63:
        raise TokenLabError(f"seed must be between 0 and 2^63 - 1, got {value}")
    return value


def parse_stop(text: str | None) -> tuple[str, ...]:
    """One stop string per line; \\n and \\t written literally stand for newline and tab."""
    if not text:
        return ()
    return tuple(line.replace("\\n", "\n").replace("\\t", "\t") for line in text.split("\n") if line)


def _int(name: str, value) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TokenLabError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise TokenLabError(f"{name} must be a whole number, got {value!r}")
    return int(f)


def sampling_params(c: Controls, seed: int | None) -> SamplingParams:
    """Validated settings; raises TokenLabError with a one-line message."""
    return SamplingParams(
        temperature=c.temperature, top_k=_int("top_k", c.top_k), top_p=c.top_p, min_p=c.min_p,
        repetition_penalty=c.repetition_penalty, max_new_tokens=_int("max_new_tokens", c.max_new_tokens),
        seed=seed, stop=parse_stop(c.stop))


class RunRegistry:
    """The cancel flag of each browser session's current run (Stop and closed tabs set it)."""

    def __init__(self):
        self._runs: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def start(self, session: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            old = self._runs.get(session)
            if old is not None:  # one run per session: a new Generate ends the old one
                old.set()
            self._runs[session] = event
        return event

    def stop(self, session: str) -> None:
        with self._lock:
            event = self._runs.get(session)
        if event is not None:
            event.set()

    def finish(self, session: str, event: threading.Event) -> None:
        with self._lock:
            if self._runs.get(session) is event:
                del self._runs[session]

    def __len__(self) -> int:
        return len(self._runs)


class EventPump:
    """Runs the engine's event generator on its own thread, so the engine keeps decoding while
    the page's previous update is serialized and sent; the handler takes events in batches."""

    _END = object()

    def __init__(self, events: Iterator, cancel: threading.Event):
        self._queue: queue.Queue = queue.Queue()
        self._cancel = cancel
        self._thread = threading.Thread(target=self._run, args=(events,), daemon=True, name="tokenlab-run")
        self._thread.start()

    def _run(self, events: Iterator) -> None:
        try:
            for ev in events:
                self._queue.put(ev)
        except BaseException as e:  # handed to the page's thread, which reports it
            self._queue.put(e)
        finally:
            self._queue.put(self._END)

    def batches(self, interval_s: float) -> Iterator[list]:
        """Lists of events, one list at most every interval_s; ends after the last event."""
        while True:
            batch = [self._queue.get()]
            deadline = time.perf_counter() + interval_s
            while batch[-1] is not self._END and (left := deadline - time.perf_counter()) > 0:
                try:
                    batch.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
            done = batch[-1] is self._END
            events = [e for e in batch if e is not self._END]
            for e in events:
                if isinstance(e, BaseException):
                    if isinstance(e, TokenLabError):
                        raise gr.Error(str(e), print_exception=False)
                    raise e
            yield events
            if done:
                return

    def close(self) -> None:
        """Stop the engine (if it still runs) and wait for its thread: the KV cache is freed."""
        self._cancel.set()
        self._thread.join()


def update_interval_for(engine: Engine) -> float:
    """Seconds between streamed page updates. On a CPU each update's serialization takes a core
    and the GIL from the engine's thread: on 2 cores, at 10 updates a second the page received
    84% of the engine's decode rate alone, at 5 a second 90% (four alternated runs each, with
    bench/run.py's client)."""
    return 0.1 if engine.device.type == "cuda" else 0.2


def _seed_or_random(text) -> int:
    """The seed typed, or a random one: either way the run knows, and shows, its seed."""
    seed = parse_seed(text)
    return secrets.randbelow(2**31) if seed is None else seed


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"


class Handlers:
    """The engine and the run registry, passed in; each method is one page event."""

    def __init__(self, engine: Engine, registry: RunRegistry | None = None, top_n: int = 10,
                 update_interval_s: float | None = None):
        self.engine, self.registry, self.top_n = engine, registry or RunRegistry(), top_n
        self.update_interval_s = update_interval_s or update_interval_for(engine)

    # -------------------------------------------------------- generate (also the /generate API)

    def generate(self, prompt, mode, system, temperature, top_k, top_p, min_p, repetition_penalty,
                 max_new_tokens, seed, stop, request: gr.Request = None) -> Iterator[tuple]:
        """Stream a run: the Controls values in order (gradio adds the request). Yields updates."""
        c = Controls(prompt, mode, system, temperature, top_k, top_p, min_p, repetition_penalty,
                     max_new_tokens, seed, stop)
        try:
            rec = self._prepare(c, _seed_or_random(c.seed))
        except TokenLabError as e:
            raise gr.Error(str(e), print_exception=False) from None
        session = _session(request)
        cancel = self.registry.start(session)
        notice = ""
        n, room = len(rec.prompt_ids), self.engine.cfg.max_seq_len - len(rec.prompt_ids)
        if rec.params.max_new_tokens > room:
            notice = (f"Max new tokens lowered from {rec.params.max_new_tokens} to {room}: the prompt "
                      f"uses {n} of the {self.engine.cfg.max_seq_len}-token context window.")
        events = self.engine.generate_ids(rec.prompt_ids, rec.params, self.top_n, cancel)
        stream = EventPump(events, cancel)
        try:
            yield self.outputs(rec, notice)
            for batch in stream.batches(self.update_interval_s):
                for ev in batch:
                    if isinstance(ev, DoneEvent):
                        rec.done = ev
                    else:
                        rec.steps.append(ev)
                yield self.outputs(rec, notice)  # the last one carries the complete text
        finally:
            stream.close()
            self.registry.finish(session, cancel)

    def outputs(self, rec: fmt.RunRecord, notice: str = "") -> tuple:
        """Values for: output, bars, stats, KV formula, notice, run state.

        Only what changes with every token streams here, and every value is sent: a gr.skip()
        costs more than a small value, as Gradio rebuilds the component on the server. The
        prompt's view and the charts, larger and slower to change, come from `begin`,
        `live_charts` (twice a second while the run streams) and `after_run`.
        """
        n = len(rec.steps)
        return (
            fmt.highlighted_output(rec),
            fmt.bars_html(rec.steps[-1] if rec.steps else None),
            fmt.stats_markdown(self.engine, rec),
            fmt.kv_formula(self.engine, len(rec.prompt_ids) + n if n else None),
            notice,
            rec,
        )

    def begin(self, prompt, mode, system, temperature, top_k, top_p, min_p, repetition_penalty,
              max_new_tokens, seed, stop) -> tuple:
        """At the click, before the run is queued: the prompt as fed and its tokens, empty
        charts, and the chart timer on. Bad input shows nothing here; `generate` reports it."""
        c = Controls(prompt, mode, system, temperature, top_k, top_p, min_p, repetition_penalty,
                     max_new_tokens, seed, stop)
        try:
            rec = self._prepare(c, 0)
        except TokenLabError:
            rec = fmt.RunRecord()
        empty = fmt.RunRecord()
        return (rec.prompt_text, fmt.prompt_tokens_view(self.engine.tokenizer, rec.prompt_ids),
                fmt.kv_frame(empty), fmt.latency_frame(empty), gr.Timer(active=True))

    def live_charts(self, rec: fmt.RunRecord | None) -> tuple:
        """The KV-cache and latency charts of the running run (a timer tick while it streams)."""
        if rec is None or rec.done is not None:  # still the previous run's record, or over
            return gr.skip(), gr.skip()
        return fmt.kv_frame(rec), fmt.latency_frame(rec)

    def after_run(self, rec: fmt.RunRecord | None) -> tuple:
        """Once a run has ended: the chart timer off, the final KV-cache and latency charts, the
        step slider spanning the run's steps, and the whole-run charts."""
        rec = rec or fmt.RunRecord()
        n = len(rec.steps)
        step = gr.update(maximum=max(n - 1, 1), value=max(n - 1, 0), interactive=n > 1)
        return (gr.Timer(active=False), fmt.kv_frame(rec), fmt.latency_frame(rec), step,
                *fmt.run_chart_frames(rec))

    # -------------------------------------------------------- selecting a step after the run

    def select_step(self, rec: fmt.RunRecord | None, step) -> str:
        if rec is None or not rec.steps:
            return fmt.bars_html(None)
        i = min(max(int(step or 0), 0), len(rec.steps) - 1)
        return fmt.bars_html(rec.steps[i])

    def select_token(self, rec: fmt.RunRecord | None, evt: gr.SelectData):
        """Clicking a generated token shows its step's bars and moves the slider there."""
        if rec is None or not rec.steps or evt is None or evt.index is None:
            return gr.update(), gr.update()
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        i = min(int(index), len(rec.steps) - 1)
        return fmt.bars_html(rec.steps[i]), gr.update(value=i)

    # -------------------------------------------------------- inside one token

    def inspect_step(self, rec: fmt.RunRecord | None, step, layer) -> tuple[str, str, str]:
        """Stages with shapes and costs, attention heatmap and logit lens for the selected step."""
        from inference.anatomy import capture_step
        if rec is None or not rec.steps:
            raise gr.Error("Generate first, then pick a step to look inside.", print_exception=False)
        i = min(max(int(step or 0), 0), len(rec.steps) - 1)
        layer = min(max(int(layer or 0), 0), self.engine.cfg.n_layers - 1)
        context = rec.prompt_ids + [s.token_id for s in rec.steps[:i]]
        capture = capture_step(self.engine.model, context, layer)
        tok = self.engine.tokenizer
        return (fmt.stages_markdown(self.engine, len(rec.prompt_ids), i),
                fmt.attention_html(capture, tok), fmt.lens_html(capture, tok))

    # -------------------------------------------------------- sampling experiments

    def replay_step(self, rec: fmt.RunRecord | None, step, temperature, top_k, top_p, min_p,
                    repetition_penalty) -> tuple[str, str]:
        """The step's sampling pipeline as it ran and under new settings, from its stored logits."""
        from inference.replay import replay
        if rec is None or not rec.steps:
            raise gr.Error("Generate first, then pick a step to replay.", print_exception=False)
        i = min(max(int(step or 0), 0), len(rec.steps) - 1)
        ev = rec.steps[i]
        try:
            new = SamplingParams(temperature=temperature, top_k=_int("top_k", top_k), top_p=top_p,
                                 min_p=min_p, repetition_penalty=repetition_penalty)
        except TokenLabError as e:
            raise gr.Error(str(e), print_exception=False) from None
        seen = rec.seen_before(i)
        ran, final_ran = replay(ev.logits, rec.params, seen, ev.token_id)
        again, final_again = replay(ev.logits, new, seen, ev.token_id)
        tok = self.engine.tokenizer
        return (f"**Step {i}**, replayed from its stored logits (no model call).\n\n"
                + fmt.stages_table(ran, again, tok, ev.token_id),
                fmt.replay_bars(ev, final_ran, final_again, tok))

    def _prepare(self, c: Controls, seed: int) -> fmt.RunRecord:
        """Validate the controls and tokenize the prompt: an empty record ready to run."""
        if c.mode not in MODES:
            raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {c.mode!r}")
        params = sampling_params(c, seed)
        chat = c.mode == "chat"
        ids = self.engine.prompt_ids(c.prompt, chat, c.system)
        return fmt.RunRecord(self.engine.prompt_text(c.prompt, chat, c.system), ids, seed=seed, params=params)

    def _collect(self, c: Controls, seed: int, cancel: threading.Event) -> fmt.RunRecord:
        rec = self._prepare(c, seed)
        for ev in self.engine.generate_ids(rec.prompt_ids, rec.params, self.top_n, cancel):
            if isinstance(ev, DoneEvent):
                rec.done = ev
            else:
                rec.steps.append(ev)
        return rec

    def compare(self, prompt, mode, system, temperature, top_k, top_p, min_p, repetition_penalty,
                max_new_tokens, seed, stop, temperature_b, top_k_b, top_p_b, min_p_b, repetition_penalty_b,
                request: gr.Request = None):
        """Run A (the page's settings) and B (the compare settings) with the same prompt and seed."""
        a = Controls(prompt, mode, system, temperature, top_k, top_p, min_p, repetition_penalty,
                     max_new_tokens, seed, stop)
        b = Controls(prompt, mode, system, temperature_b, top_k_b, top_p_b, min_p_b, repetition_penalty_b,
                     max_new_tokens, seed, stop)
        session = _session(request)
        cancel = self.registry.start(session)
        try:
            chosen = _seed_or_random(seed)
            ra, rb = self._collect(a, chosen, cancel), self._collect(b, chosen, cancel)
        except TokenLabError as e:
            raise gr.Error(str(e), print_exception=False) from None
        finally:
            self.registry.finish(session, cancel)
        at = fmt.divergence(ra, rb)
        bars = (fmt.bars_html(ra.steps[at], f"A at step {at}") if at is not None and at < len(ra.steps) else "",
                fmt.bars_html(rb.steps[at], f"B at step {at}") if at is not None and at < len(rb.steps) else "")
        return (fmt.highlighted_with_marker(ra, at), fmt.highlighted_with_marker(rb, at),
                fmt.compare_summary(ra, rb, at) + f"\n\nSeed {chosen} for both.", *bars)

    def likelihood(self, rec: fmt.RunRecord | None, step, text: str) -> str:
        """How likely was this text? Teacher-forced at the selected step's position."""
        if rec is None or not rec.steps:
            raise gr.Error("Generate first, then pick the position to score from.", print_exception=False)
        i = min(max(int(step or 0), 0), len(rec.steps) - 1)
        try:
            scores = self.engine.score(rec.seen_before(i), text or "")
        except TokenLabError as e:
            raise gr.Error(str(e), print_exception=False) from None
        return (f"After the prompt and the first {i} generated tokens:\n\n" + fmt.likelihood_table(scores))

    # -------------------------------------------------------- stop, closed tabs

    def stop(self, request: gr.Request | None = None) -> None:
        self.registry.stop(_session(request))

    # -------------------------------------------------------- sharing

    def restore(self, request: gr.Request | None = None) -> tuple:
        """Controls from the page URL's query parameters; bad values are named in the notice."""
        query = dict(getattr(request, "query_params", {}) or {})
        c, problems = controls_from_query(query, Controls.for_model(self.engine.generation_defaults))
        return (*c.values(), "\n".join(problems))

    def share_link(self, prompt, mode, system, temperature, top_k, top_p, min_p, repetition_penalty,
                   max_new_tokens, seed, stop, base: str) -> str:
        """A link that restores these settings; `base` is the page's own address."""
        return share_url(base or "", Controls(prompt, mode, system, temperature, top_k, top_p, min_p,
                                              repetition_penalty, max_new_tokens, seed, stop),
                         Controls.for_model(self.engine.generation_defaults))


def controls_from_query(query: dict, defaults: Controls | None = None) -> tuple[Controls, list[str]]:
    c, problems = defaults or Controls(), []
    conv = {"temperature": float, "top_p": float, "min_p": float, "repetition_penalty": float,
            "top_k": int, "max_new_tokens": int}
    for name in Controls.names():
        if name not in query:
            continue
        raw = query[name]
        try:
            value = conv[name](raw) if name in conv else str(raw)
            if name in conv and not math.isfinite(float(value)):
                raise ValueError("not finite")
            if name == "mode" and value not in MODES:
                raise ValueError(f"not one of {MODES}")
            if name == "seed":
                parse_seed(value)
        except (ValueError, TokenLabError) as e:
            problems.append(f"Ignored link parameter {name}={raw!r}: {e}")
            continue
        setattr(c, name, value)
    for key in query:
        if key not in Controls.names() and not key.startswith("__"):
            problems.append(f"Ignored unknown link parameter {key!r}")
    try:
        sampling_params(c, parse_seed(c.seed))
    except TokenLabError as e:
        problems.append(f"The link's settings are not usable as they are: {e}")
    return c, problems


def share_url(base: str, c: Controls, default: Controls | None = None) -> str:
    """A link with every setting that differs from the defaults, plus the prompt and seed."""
    default = default or Controls()
    query = {n: v for n, v in zip(Controls.names(), c.values())
             if v != getattr(default, n) or n in ("prompt", "seed")}
    return f"{base.split('?')[0]}?{urlencode(query)}"
