"""The page: its sections laid out from one ordered list, their events wired, and the server
launched. Each section (ui/run, ui/experiments, ui/samples, ui/text_score, ui/inside, …) owns its
components, its handlers and its rendering, and is a module with build(page, h) and, where it has
events, wire(page, h, demo); one built inside another's layout names its SLOT; one with hooks that
must follow every other's has keep(page, h). What the sections share is below them (ui/shared);
the page's styles and scripts are in ui/assets."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import gradio as gr
import httpx
from fastapi import Request
from fastapi.responses import FileResponse, PlainTextResponse
from starlette.middleware import Middleware

from inference.device import available_memory_bytes
from inference.errors import TokenLabError
from server.guard import Beside, RouteGuard, visitor_openapi
from server.limits import ENGINE, Limits
from server.owners import login_of
from server.sessions import HeartbeatWatch, session_capacity
from ui import card, chat, share
from ui.branches import section as branches
from ui.decoding import section as decoding
from ui.edit import section as edit
from ui.experiments import section as experiments
from ui.glossary import definitions_html
from ui.handlers import Handlers
from ui.inside import section as inside
from ui.lens import section as lens
from ui.lesson import section as lesson
from ui.loom import section as loom
from ui.run import section as run
from ui.samples import section as samples
from ui.shared.downloads import DOWNLOAD_ROUTE
from ui.text_score import section as text_score
from ui.wiring import Page
from ui.work import section as work

# The page's sections, in their order on the page (top to bottom) and of their wiring: the
# lesson's entry first (in view on the first screen, wide or narrow), the model card, the saved
# work's line, the run (the main grid: chat, edit, branches and share are built in its slots),
# then the panels to explore with. The run section's chain (Page.chain_run) is wired before the
# sections that start a run by it (chat, edit, branches, text_score, decoding, loom).
SECTIONS = (lesson, card, work, run, chat, edit, branches, share, experiments, samples, text_score, decoding, loom, lens, inside)

# The page's styles, those of the panels to explore with (many samples, a text's probability),
# of editing and saved work, the lesson, decoding and the quantization lens.
PAGE_CSS = "\n".join((Path(__file__).parent / "assets" / name).read_text(encoding="utf-8")
                     for name in ("page.css", "explore.css", "work.css", "lesson.css", "decoding.css", "lens.css", "loom.css"))
# Wide tables (in Markdown and our HTML) say when they scroll sideways (page.css draws it).
SCROLL_JS = (Path(__file__).parent / "assets" / "scroll.js").read_text(encoding="utf-8")
# Each term's definition on hover, tap and focus; the controls' labels that are terms marked.
GLOSSARY_JS = (Path(__file__).parent / "assets" / "glossary.js").read_text(encoding="utf-8")
# A stream cut by leaving the page (a reload, a closed tab) is expected: not logged as an error
# (assets/leaving.js; gradio runs the page's <head> scripts once the page has loaded).
HEAD = "<script>\n" + (Path(__file__).parent / "assets" / "leaving.js").read_text(encoding="utf-8") + "</script>"
# Gradio 6's status tracker announces "common.complete" to screen readers when an event with a
# progress indicator ends, a key its English messages lack (it reads out the key itself).
MESSAGES = gr.I18n(en={"common.complete": "Done"})


def build_ui(engine, handlers: Handlers | None = None, sections: Sequence = SECTIONS) -> gr.Blocks:
    """The page for an engine (inference.contract's Engine): what it cannot do says so in place."""
    h = handlers or Handlers(engine)
    page = Page(sections, h)
    # Gradio's temporary files (the page makes none; uploads are refused) are deleted hourly
    # and when the server stops.
    with gr.Blocks(title="Token Lab", delete_cache=(3600, 3600)) as demo:
        gr.Markdown("# Token Lab\nWatch a language model predict its answer one token at a time: "
                    "every step shows the candidates, the distribution it sampled from, and the "
                    "memory and compute it took.")
        # The glossary's definitions, hidden: what each term's aria-describedby names (ui/glossary.py).
        gr.HTML(definitions_html(), elem_id="glossary-defs")
        for section in sections:  # (one with a SLOT is built where its host fills it)
            if getattr(section, "SLOT", None) is None:
                section.build(page, h)
        for section in sections:  # hooks that follow every other section's (the saved work's)
            if hasattr(section, "keep"):
                section.keep(page, h)
        for section in sections:
            if hasattr(section, "wire"):
                section.wire(page, h, demo)
        demo.load(None, js=SCROLL_JS)
        demo.load(None, js=GLOSSARY_JS)
    demo.tokenlab_handlers = h  # launch wires the queue's admission and the downloads to them
    demo.tokenlab_page = page
    return demo


QUEUE_POLL_S = 0.02
# Gradio keeps the records of the last 10,000 events for its monitoring dashboard (off here, its
# route closed) and summarizes all of them after every event: one or two a visitor, kept for
# thousands of visitors. The last EVENTS_KEPT are kept.
EVENTS_KEPT = 64


# Page events handled at once. A run's event mostly waits for its tokens: the engine's scheduler
# batches every run into one forward pass per step and queues what the KV pool cannot hold, so
# Gradio's queue must not serialize them. What one visitor may hold is server/admission.py's Admission.
CONCURRENCY = 64


def configure_queue(demo: gr.Blocks, engine, queue_size: int = 16,
                    concurrency: int = CONCURRENCY) -> None:
    # api_open=False: the queued events are reached only through the queue (where the
    # admission checks them), never through the direct REST routes that would skip it.
    demo.queue(default_concurrency_limit=concurrency, max_size=queue_size, api_open=False)
    h = getattr(demo, "tokenlab_handlers", None)
    if h is not None:
        h.page.admission.attach(demo)
    # Gradio's queue loop wakes every 1 ms while it waits; each wake takes the GIL from the
    # engine's thread, costing decode speed on a small CPU. 20 ms is still instant to a person.
    if hasattr(demo._queue, "sleep_when_free"):
        demo._queue.sleep_when_free = QUEUE_POLL_S
    if hasattr(demo._queue, "ANALYTICS_MAX_EVENTS"):
        demo._queue.ANALYTICS_MAX_EVENTS = EVENTS_KEPT
    record_absent_matplotlib()


def record_absent_matplotlib() -> None:
    """Gradio imports matplotlib when it enters and leaves every event (to set and restore its
    backend); where matplotlib is not installed, each of those imports fails anew after
    searching every path again, as Python keeps no record of a failed import: about a fifth of
    the page's own CPU while 8 runs streamed (py-spy), on the cores the engine decodes on.
    Recording it as absent makes each of those imports fail at once. Nothing is changed where
    matplotlib is installed."""
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        sys.modules["matplotlib"] = None


def serve_downloads(app, handlers: Handlers) -> None:
    """The page's downloads (a run's steps, its settings) at /DOWNLOAD_ROUTE/<token>/<name>:
    files the page wrote itself, by a random token, outside gradio's file routes (which the
    page does not serve: server/guard.py)."""
    async def download(token: str, name: str, request: Request):
        path = handlers.page.runs.downloads.path(token, name, login_of(request.scope))
        if path is None:
            return PlainTextResponse("No such download (the page keeps the latest ones).", status_code=404)
        return FileResponse(path, filename=name, media_type="application/octet-stream")

    app.add_api_route(f"/{DOWNLOAD_ROUTE}/{{token}}/{{name}}", download, methods=["GET"])


class PageEvents:
    """The page's events as the route guard checks a request against them (server.guard.Events):
    which fn_index exist, and what the value at data[i] of one is called on the page."""

    def __init__(self, demo: gr.Blocks, registry=None):
        self.demo, self.registry = demo, registry
        page = getattr(demo, "tokenlab_page", None)
        self._names = {id(c): name for name, c in getattr(page, "_by_name", {}).items()}

    def cancelled(self, session: str, fn_index: int) -> None:
        """A cancelled engine job ends at its next step: gradio stops an event that streams, but
        one that returns once (a beam search, a speculative run, a comparison) runs to its end."""
        fn = self.demo.fns.get(fn_index)
        if fn is not None and fn.concurrency_id == ENGINE and self.registry is not None:
            self.registry.stop(session, starting=True)

    def gone(self, session: str) -> None:
        """The session's client went away mid-event: its engine job, if any, ends at its next step."""
        if self.registry is not None:
            self.registry.stop(session, starting=True)

    def streams(self, session: str) -> bool:
        return session in self.demo._queue.pending_messages_per_session

    def joined(self, session: str) -> None:
        """The session asked for an event: a stop meant for an earlier one no longer applies."""
        if self.registry is not None:
            self.registry.resume(session)

    def indices(self) -> set:
        return set(self.demo.fns)

    def input_name(self, fn_index: int, where: str) -> str | None:
        m = re.match(r"data\[(\d+)\]", where)
        fn = self.demo.fns.get(fn_index)
        if m is None or fn is None or int(m[1]) >= len(fn.inputs):
            return None
        component = fn.inputs[int(m[1])]
        return self._names.get(id(component)) or getattr(component, "label", None)


# Gradio checks that a page it starts answers at its local address with one HEAD request and a
# 3-second timeout (networking.url_ok), and refuses to go on without one: on a busy machine (two
# cores, tests beside other jobs) a page that was up failed to start. Its check is off (its
# `_frontend` only gates it) and answers() checks instead, with time to answer.
_NO_GRADIO_PROBE = {"_frontend": False} if "_frontend" in inspect.signature(gr.Blocks.launch).parameters else {}
ANSWER_WITHIN_S = 60.0


class PageUnreachable(TokenLabError):
    """The page's server started but its local address does not answer."""


def answers(url: str, within_s: float = ANSWER_WITHIN_S) -> bool:
    """Whether the page answers a HEAD at url within within_s seconds, asked again after each
    failure. Directly, never through a proxy the environment names: it is this machine's page."""
    deadline = time.monotonic() + within_s
    with httpx.Client(trust_env=False, verify=False) as client:
        while True:
            left = deadline - time.monotonic()
            try:
                if client.head(url, timeout=max(0.1, min(10.0, left))).status_code < 500:
                    return True  # (401: a login first)
            except httpx.HTTPError:
                pass
            if time.monotonic() + 0.2 >= deadline:
                return False
            time.sleep(0.2)


def launch(demo: gr.Blocks, engine, *, host: str = "127.0.0.1", port: int | None = None,
           share: bool = False, auth: tuple[str, str] | list[tuple[str, str]] | None = None, block: bool = True,
           queue_size: int = 16, concurrency: int = CONCURRENCY, beside: Sequence[Beside] = (),
           stopped: threading.Event | None = None):
    """Serve the page; with block, print where and wait until interrupted or `stopped` is set.
    Returns gradio's (app, local URL, share URL). concurrency: runs Gradio hands the scheduler at
    once. beside: services mounted on the same server (app.py's serve: the OpenAI-compatible API),
    behind the same route guard and logins."""
    configure_queue(demo, engine, queue_size, concurrency)
    h = getattr(demo, "tokenlab_handlers", None)
    limits = h.page.limits if h is not None else Limits()
    sessions = h.page.admission.sessions if h is not None else None
    owners = h.page.owners if h is not None else None
    middleware = [Middleware(RouteGuard, sessions=sessions, beside=tuple(beside), owners=owners,
                             events=PageEvents(demo, h.page.registry if h is not None else None),
                             logins=bool(auth))]
    if h is not None:  # which sessions still have a tab, and their state swept once gone
        middleware.append(Middleware(HeartbeatWatch, keeper=h.page.keeper))
    served = demo.launch(server_name=host, server_port=port, share=share, auth=auth, **_NO_GRADIO_PROBE,
                         prevent_thread_lock=True, enable_monitoring=False, show_error=False,
                         css=PAGE_CSS, head=HEAD, footer_links=["api"], quiet=True, i18n=MESSAGES,
                         # The page's own routes only, small bodies, each visitor's sessions
                         # counted (server/guard.py); no uploads, no run history kept.
                         app_kwargs={"middleware": middleware},
                         max_file_size=1, run_history=False,
                         # Sessions kept: a shared page's cap, and what the memory can hold.
                         state_session_capacity=session_capacity(limits.session_capacity,
                                                                 available_memory_bytes()))
    if served and not share and not answers(served[1]):
        demo.close(verbose=False)
        raise PageUnreachable(f"the page's server started but {served[1]} did not answer within "
                              f"{ANSWER_WITHIN_S:.0f} s")
    if h is not None and served:  # (a test's stand-in launch returns nothing)
        serve_downloads(served[0], h)
        h.page.keeper.attach(served[0])
    for service in (beside if served else ()):
        service.mount(served[0])
    if served:  # /openapi.json lists what a visitor may call, nothing more
        served[0].openapi_schema = visitor_openapi(served[0])
    if block:
        _, local_url, share_url = served
        print(f"Token Lab is running on {local_url}"
              + (f" and publicly on {share_url}" if share_url else " (python app.py --share makes a public link)"),
              flush=True)
        wait_until_stopped(demo, stopped)
    return served


def wait_until_stopped(demo: gr.Blocks, stopped: threading.Event | None = None) -> None:
    """Gradio's block_thread without its "Keyboard interruption in main thread" line (printed at
    SIGTERM too, which app.py raises as one): the wait ends at Ctrl-C or SIGTERM, when `stopped`
    is set, or when the page closes; the caller closes the page, and a share link's tunnel goes
    with it. `stopped`: app.py sets it at the signal, since the KeyboardInterrupt its handler
    raises is lost where the signal lands in code that swallows exceptions (a weakref callback
    while the page started: the page then served on, with its engine closed, until killed)."""
    from gradio.tunneling import CURRENT_TUNNELS
    try:
        while demo.is_running and not (stopped is not None and stopped.is_set()):
            time.sleep(0.1)
    except (KeyboardInterrupt, OSError):
        for tunnel in CURRENT_TUNNELS:
            tunnel.kill()
