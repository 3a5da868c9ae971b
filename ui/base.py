"""What every section's handlers share (PageContext: the engine and what it is, the run registry,
the limits of a shared page), the base of each section's handlers (Section), and how a page event
names its arguments and holds the engine."""

from __future__ import annotations

import functools
import inspect
import logging
from contextlib import contextmanager
from typing import Callable

import gradio as gr

from inference.errors import TokenLabError
from inference.serving.models import Models
from server.admission import Admission
from server.limits import Limits, Refused, client_key
from server.owners import Owners
from server.registry import RunRegistry
from server.sessions import SessionKeeper
from ui.controls import NAMES, Controls, page_message
from ui.format import bars_html
from ui.models import ModelViews
from ui.run_state import RunRecord

log = logging.getLogger("tokenlab.page")


def named_args(*names: str):
    """The method takes a value for each of `names` (the last ones as *values), then gradio's
    request; the signature names them all, so that gradio passes the request (it finds it only
    among named parameters)."""
    def wrap(fn):
        n = len(names)

        def method(self, *args, request=None):
            return fn(self, *args[:n], request=args[n] if len(args) > n else request)
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


class PageContext:
    """What every section's handlers share: the models offered (the default one's engine, card
    and settings, which the page is laid out with), the run registry, the limits of a shared page
    and their admission, and the keeper that deletes a closed tab's state. The engine keeps
    inference.contract's Engine contract; what it can do is `caps`."""

    def __init__(self, engine, registry: RunRegistry | None = None, top_n: int = 10,
                 update_interval_s: float | None = None, limits: Limits | None = None, models=None):
        """limits: what one visitor may cost (server/limits.py); none by default. models: the models
        offered (inference.serving.models.Models, `engine` its default); just `engine` if none."""
        self.registry, self.top_n = registry or RunRegistry(), top_n
        self.limits = limits or Limits()
        self.admission = Admission(self.registry, self.limits)
        # What a section keeps per session (a click not yet taken by the engine), let go of when
        # the keeper deletes the session's state (server/sessions.py); launch attaches the keeper.
        self.forgetters: list[Callable[[str], None]] = []
        self.owners = Owners()  # whose each session is (server/owners.py): the route guard checks it
        self.keeper = SessionKeeper(self.registry, self.admission.sessions, forget=self.forget, owners=self.owners)
        self.models = models or Models.of(engine)
        self.view = ModelViews(self.models, top_n, self.limits.max_new_tokens, update_interval_s)
        # The default model's: what the page is laid out with.
        first = self.view()
        self.engine, self.info, self.caps, self.context = first.engine, first.info, first.caps, first.context
        self.bars_note, self.defaults, self.default_system = first.bars_note, first.defaults, first.default_system
        self.update_interval_s = first.update_interval_s
        # The page's runs: the one prepared request and its stream (ui/shared/runs.py), made
        # with the sections' handlers (ui/handlers.py).
        self.runs = None

    def forget(self, session: str) -> None:
        self.registry.resume(session)  # a stop it left for a job that never came
        for forget in self.forgetters:
            forget(session)

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
    def job(self, request: gr.Request | None):
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

    def bars(self, step, title: str = "", rec=None, pick: bool = False) -> str:
        """A step's bars; `rec` (the run) tags the candidates its logit bias moved or its
        constraint forbade, and names the model whose note goes under them."""
        if rec is None:
            return bars_html(step, title, self.bars_note, None)
        constrained = rec.params is not None and bool(rec.params.constraint)
        # pick: the main bars of a run that has ended, whose candidates start a branch.
        return bars_html(step, title, self.view(rec.model).bars_note, rec.bias, constrained,
                         pick and rec.done is not None and rec.controls is not None)


def _shared(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.page, name), doc=doc)


class Section:
    """One section's page events (ui/<section>/handlers.py) over the page's shared context. What a
    section reads of that context is named here, so its code says self.view, self._job, …; no
    section is given another's: a run is started and shown through self.runs. Events that run outside the queue
    (queue=False) never raise: gradio answers those with an HTTP 500, so they return their message
    in the panel instead. Multi-output events return {component name: value}; a name left out
    keeps its component as it is."""

    def __init__(self, page: PageContext):
        self.page = page

    engine = _shared("engine", "The default model's engine (inference.contract's Engine).")
    info = _shared("info", "The default model's EngineInfo.")
    caps = _shared("caps", "What the default model's engine can do (Capabilities).")
    context = _shared("context", "The default model's context window.")
    defaults = _shared("defaults", "The default model's sampling defaults, as the controls show them.")
    default_system = _shared("default_system", "The default model's system prompt.")
    models = _shared("models", "The models offered (inference.serving.models.Models).")
    view = _shared("view", "view(label): what the page derives from an offered model (ui/models.py).")
    top_n = _shared("top_n", "Candidates a step shows.")
    registry = _shared("registry", "Each session's running engine job (server/registry.py).")
    limits = _shared("limits", "What one visitor may cost (server/limits.py).")
    admission = _shared("admission", "Who may start an engine job now (server/admission.py).")
    keeper = _shared("keeper", "Deletes a closed tab's state (server/sessions.py).")
    admit = _shared("admit", "PageContext.admit: a click's session, or its refusal.")
    runs = _shared("runs", "The page's runs: prepare, stream and show one (ui/shared/runs.py).")
    _job = _shared("job", "PageContext.job: hold the session's one engine job.")
    _bars = _shared("bars", "PageContext.bars: a step's bars.")
