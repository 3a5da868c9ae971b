"""How the API's routes answer: every error as an OpenAI error body (guarded), a streamed answer
that cancels its runs however it ends (ClosingStream, sse), and the runs' events gathered for an
answer given at their end (collect) or turned into chunks (run_chunks)."""

from __future__ import annotations

import asyncio
import json
import logging
from functools import wraps

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from api.errors import APIError, from_engine
from api.runs import ENDS, Runs
from inference.errors import TokenLabError
from inference.events import DoneEvent

log = logging.getLogger("tokenlab.api")
DISCONNECT_POLL_S = 0.5  # how often a request answered at its end looks whether its client is still there


class ClientGone(Exception):
    """The client closed its connection before its answer was ready (a timeout, Ctrl-C)."""


def guarded(fn):
    """A route whose every error is an OpenAI error body: the request's faults are 4xx with
    their one-line message; anything else, a fault of the server's, a 500 saying so."""
    @wraps(fn)
    async def route(request: Request):
        try:
            return await fn(request)
        except APIError as e:
            return e.response()
        except ClientGone:  # nobody reads it: nginx's "client closed request"
            return Response(status_code=499)
        except TokenLabError as e:
            return from_engine(e).response()
        except Exception:
            log.exception("the API failed on %s", request.url.path)
            return APIError(500, "the server failed on this request (its log has why)", type="api_error").response()
    return route


class ClosingStream(StreamingResponse):
    """Closes its events however the response ends (a client gone mid-stream included), then
    calls on_close: the request's runs are cancelled and the visitor's share given back at once."""

    def __init__(self, content, on_close, **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self.on_close()


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"



async def run_chunks(runs: Runs, writer, step_chunk, done_chunk, generated: list):
    """The runs' events as (chunk, False), but steps whose chunk would say nothing;
    generated[0] counts the tokens made."""
    async for c, ev in runs.events():
        if isinstance(ev, DoneEvent):
            generated[0] += ev.generated_tokens
            yield done_chunk(c, ev), False
        elif not writer.says_nothing(ev):
            yield step_chunk(c, ev), False


async def collect(runs: Runs, k: int, disconnected) -> tuple[dict, dict]:
    """Every run's steps and its end: ({index: [StepEvent]}, {index: DoneEvent}). A client gone
    before the end (await disconnected() says so) ends the runs, ClientGone: an answer nobody
    waits for is not computed to its end (a stream's runs end as its response is closed)."""
    steps: dict = {i: [] for i in range(k)}
    done: dict = {}

    async def gather():
        async for i, ev in runs.events():
            if isinstance(ev, ENDS):
                done[i] = ev
            else:
                steps[i].append(ev)

    if k:
        task = asyncio.ensure_future(gather())
        try:
            while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_S))[0]:
                if await disconnected():
                    raise ClientGone
            task.result()  # its error, if the engine raised one
        finally:
            if not task.done():  # runs.events() closes: every run of the request is cancelled
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    return steps, done

