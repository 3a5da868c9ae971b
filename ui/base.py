"""What every section's handlers share: the engine and what it is, the run registry, the limits
of a shared page, and how a page event names its arguments and holds the engine."""

from __future__ import annotations

import functools
import inspect
import logging
import tempfile
import threading
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import gradio as gr

from inference.errors import TokenLabError
from inference.serving.models import Models
from ui.controls import NAMES, Controls, page_message
from ui.format import bars_html
from server.admission import Admission
from server.limits import Limits, Refused, client_key
from ui.run_state import RunRecord
from server.sessions import SessionKeeper
from ui.models import ModelViews
from server.registry import RunRegistry

log = logging.getLogger("tokenlab.page")


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
        method.__annotations__ = {"request": gr.Request}  # how gradio finds where to pass it
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
        method.__annotations__ = {"request": gr.Request}  # how gradio finds where to pass it
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        method.__signature__ = inspect.Signature(
            [inspect.Parameter(p, kind) for p in ("self", *NAMES, *extra)]
            + [inspect.Parameter("request", kind, default=None, annotation=gr.Request)]
            + [inspect.Parameter(p, kind, default=None) for p in after])
        return method
    return wrap


def page_error(e: TokenLabError) -> gr.Error:
    """A user's error as the page's one-line toast, its control called by its label."""
    return gr.Error(page_message(e, one_line=True), print_exception=False)


def failure_line(e: Exception, what: str) -> str:
    """An error that ended `what` ("a run") mid-way, in one line: a user's error as the page words
    it, any other with its kind (a fault: its traceback goes to the server's log)."""
    if not isinstance(e, (TokenLabError, gr.Error)):
        log.error("%s failed mid-way", what, exc_info=e)
    text = e.message if isinstance(e, gr.Error) else page_message(e) if isinstance(e, TokenLabError) \
        else f"{type(e).__name__}: {e}"
    return " ".join(str(text).split())


def session_of(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"


def who(request: gr.Request | None) -> tuple[str, str]:
    """(session, client) of a page event; client as server.limits.client_key names it."""
    return session_of(request), client_key(request)


def step_index(rec: RunRecord, step) -> int:
    """The step asked for, within the run (anything that is not a number: step 0)."""
    try:
        i = int(float(step or 0))
    except (TypeError, ValueError, OverflowError):
        i = 0
    return min(max(i, 0), len(rec.steps) - 1)


class PageBase:
    """The engine and the run registry, passed in; each section's handler class (a mixin of
    ui.handlers.Handlers) adds its page events. The engine keeps inference.contract's Engine
    contract; what it can do is `self.caps`. Events that run outside the queue (queue=False)
    never raise: gradio answers those with an HTTP 500, so they return their message in the
    panel instead. Multi-output events return {component name: value}; a name left out keeps
    its component as it is."""

    def __init__(self, engine, registry: RunRegistry | None = None, top_n: int = 10,
                 update_interval_s: float | None = None, limits: Limits | None = None,
                 files_dir: str | None = None, models=None):
        """limits: what one visitor may cost (server/limits.py); none by default. models: the models
        offered (inference.serving.models.Models, `engine` its default); just `engine` if none."""
        self.registry, self.top_n = registry or RunRegistry(), top_n
        self.limits = limits or Limits()
        self.admission = Admission(self.registry, self.limits)
        # Deletes a closed tab's state on the server (server/sessions.py); launch attaches it.
        self.keeper = SessionKeeper(self.registry, self.admission.sessions, forget=self._forget)
        self.models = models or Models.of(engine)
        self.view = ModelViews(self.models, top_n, self.limits.max_new_tokens, update_interval_s)
        # The default model's: what the page is laid out with.
        first = self.view()
        self.engine, self.info, self.caps, self.context = first.engine, first.info, first.caps, first.context
        self.bars_note, self.defaults, self.default_system = first.bars_note, first.defaults, first.default_system
        self.update_interval_s = first.update_interval_s
        # Sessions whose run was clicked but not yet taken by the engine (their click time),
        # and those of them whose Stop came before the engine did.
        self._waiting: dict[str, float] = {}
        self._stopped_waiting: set[str] = set()
        # The run each session's click prepared (begin), for the page's generate to run as it is.
        self._prepared: dict[str, object] = {}
        self._lock = threading.Lock()
        # Downloads the page offers (ui/run/handlers.py): written here, the oldest deleted once
        # there are more than KEEP_FILES.
        self._files_dir = Path(files_dir or tempfile.mkdtemp(prefix="tokenlab-downloads-"))
        self._files: deque[str] = deque()  # tokens, oldest first
        self._file_paths: dict[str, Path] = {}

    def _forget(self, session: str) -> None:
        """The session's state was deleted (server/sessions.py): a click of it that the engine never
        took (a run cancelled while it waited, in a tab that vanished without its unload) is
        not kept for ever."""
        with self._lock:
            self._waiting.pop(session, None)
            self._prepared.pop(session, None)
            self._stopped_waiting.discard(session)

    def admit(self, request: gr.Request | None) -> str:
        """At a click that will start an engine job: its session, or a page error (one line)
        when the session has a job going or its client is at its share. Runs in the queue,
        unlimited, so that the refusal is a message and not an HTTP 500."""
        session, client = who(request)
        self.registry.settle(session)  # a run just stopped ends within a step
        refusal = self.admission.refusal(session, client)
        if refusal is not None:
            raise gr.Error(refusal, print_exception=False)
        return session

    @contextmanager
    def _job(self, request: gr.Request | None):
        """Hold the session's one engine job while the body runs; yields its cancel flag. A
        session with a job going, or a client at its share, is refused with a page error."""
        session, client = who(request)
        try:
            cancel = self.registry.start(session, client, self.limits.runs_per_client)
        except Refused as e:
            raise gr.Error(str(e), print_exception=False) from None
        try:
            yield cancel
        finally:
            self.registry.finish(session, cancel)

    def _bars(self, step, title: str = "", rec=None, pick: bool = False) -> str:
        """A step's bars; `rec` (the run) tags the candidates its logit bias moved or its
        constraint forbade, and names the model whose note goes under them."""
        if rec is None:
            return bars_html(step, title, self.bars_note, None)
        constrained = rec.params is not None and bool(rec.params.constraint)
        # pick: the main bars of a run that has ended, whose candidates start a branch.
        return bars_html(step, title, self.view(rec.model).bars_note, rec.bias, constrained,
                         pick and rec.done is not None and rec.controls is not None)
