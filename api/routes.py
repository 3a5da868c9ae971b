"""The API's routes, mounted beside the page on its web server (app.py's serve): the same
engine and scheduler, the same logins (an API key is USER:PASSWORD of a login, sent as
`Authorization: Bearer USER:PASSWORD`) and the same per-visitor limits as the page (server/):
each completion a request asks for is one of the visitor's runs, a request beyond their share is
refused with 429, a body over the page's size limit with 413 (RouteGuard, before it is read).

OpenAI's /v1/models, /v1/completions, /v1/chat/completions; vLLM's /tokenize, /detokenize and
/tokenizer_info at the root, which Token Lab's own remote engine (--engine-url) and
lm-evaluation-harness's remote tokenizer call.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.answers import Writer, usage
from api.errors import APIError, bad, error_body, from_engine
from api.params import (COMPLETIONS_MAX_TOKENS, chat_arguments, chat_ask, check_fields, check_model, check_unicode_values,
                        completion_ask)
from api.runs import Runs
from api.streams import ClosingStream, collect, guarded, run_chunks, sse
from inference.decoding.beams import UNSCORED, unscored_message
from inference.errors import InputError, TokenLabError, shown
from inference.request import RunRequest, prepare_run
from inference.serving.models import Models
from server.limits import Limits, Refused, client_key

TOKENIZE_SERVED = "/tokenize takes prompt (with add_special_tokens) or messages, and model"
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
SERVED = {"/v1/models": "GET", "/v1/completions": "POST", "/v1/chat/completions": "POST", "/tokenize": "POST",
          "/detokenize": "POST", "/tokenizer_info": "GET"}
# Every path the API answers (its catch-all included): a refusal there is OpenAI's error body.
PATHS = re.compile(r"/v1/.*|/(tokenize|detokenize|tokenizer_info)/?")
# A JSON escape of a UTF-16 surrogate: only a body holding one can hold a lone one.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


class API:
    """The engine (inference.contract's Engine) behind OpenAI's API. registry and limits are
    the page's (server.registry.RunRegistry, server.limits.Limits); logins the page's --auth logins.
    It is mounted beside the page (server.guard.Beside): `paths` and `refusal` let the page's
    route guard refuse a request to it in OpenAI's words."""
    paths = PATHS

    def __init__(self, engine, registry, limits: Limits | None = None, logins=(), models=None):
        """models: the models the page offers (inference.serving.models.Models; `engine` the
        default); each is served under its label, loaded on its first request."""
        self.engine, self.registry, self.limits = engine, registry, limits or Limits()
        self.logins = {user: password for user, password in logins}
        self.offered = models or Models.of(engine)
        self.model, self.context = self.offered.default, engine.describe().max_seq_len

    def pick(self, body) -> "API":
        """This API for the model the request names (absent: the default): a copy sharing the
        registry, limits and logins, with that model's engine. 404 for a model not offered."""
        name = body.get("model") if isinstance(body, dict) else None
        if name is None or name == self.model:
            return self
        if not isinstance(name, str) or name not in self.offered.labels:
            check_model(body, self.model, self.offered.labels)
        view = copy.copy(self)
        view.engine = self.offered.engine(name)  # loaded now on its first use
        view.model, view.context = name, view.engine.describe().max_seq_len
        return view

    @staticmethod
    def refusal(status: int, message: str) -> dict:
        code = {404: "not_found", 413: "request_too_large", 429: "rate_limit_exceeded"}.get(status)
        return error_body(message, "invalid_request_error", None, code)

    def mount(self, app) -> None:
        for path, fn, method in (("/v1/models", self.models, "GET"),
                                 ("/v1/completions", self.completions, "POST"),
                                 ("/v1/chat/completions", self.chat, "POST"),
                                 ("/tokenize", self.tokenize, "POST"),
                                 ("/detokenize", self.detokenize, "POST"),
                                 ("/tokenizer_info", self.tokenizer_info, "GET")):
            app.add_api_route(path, guarded(fn), methods=[method], include_in_schema=False)
        # Last: any other /v1/ path (embeddings, a wrong method) answers in OpenAI's error shape,
        # as does a wrong method on the tokenizer's routes.
        app.add_api_route("/v1/{rest:path}", guarded(self.not_served), include_in_schema=False, methods=METHODS)
        for path, method in SERVED.items():
            if path.startswith("/v1/"):
                continue  # (the catch-all above answers these)
            app.add_api_route(path, guarded(self.not_served), include_in_schema=False,
                              methods=[m for m in METHODS if m != method])

    # ------------------------------------------------------------ who asks

    def client(self, request: Request) -> str:
        """The visitor, as the page's limits count them: their login (the API key) when the
        server has logins, else their address. 401 for a missing or wrong key."""
        if not self.logins:
            return client_key(request)
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header[:7].lower() == "bearer " else ""
        user, _, password = key.partition(":")
        expected = self.logins.get(user)
        if expected is None or not secrets.compare_digest(password.encode(), expected.encode()):
            raise APIError(401, "a login is required: send Authorization: Bearer USER:PASSWORD "
                                "(the API key is one of the page's logins)", code="invalid_api_key")
        return f"user {user}"

    def start_jobs(self, client: str, k: int) -> tuple[list[str], list]:
        """Register a request's k engine jobs as the visitor's: (their names, cancel flags).
        429 when the visitor's share cannot hold them."""
        cap = self.limits.runs_per_client
        if cap is not None and k > cap:
            raise APIError(429, f"This request asks for {k} runs at once; the server allows {cap} "
                                "at a time per visitor. Ask for fewer (n, prompts).",
                           type="rate_limit_error", code="rate_limit_exceeded")
        base = f"api-{uuid.uuid4().hex}"
        names, cancels = [], []
        try:
            for i in range(k):
                cancels.append(self.registry.start(f"{base}-{i}", client, cap))
                names.append(f"{base}-{i}")
        except Refused as e:
            self.finish_jobs(names, cancels)
            raise APIError(429, str(e), type="rate_limit_error", code="rate_limit_exceeded") from None
        return names, cancels

    def finish_jobs(self, names, cancels) -> None:
        for name, cancel in zip(names, cancels):
            self.registry.finish(name, cancel)

    async def body(self, request: Request) -> dict:
        try:
            raw = await request.body()
            body = json.loads(raw)
        except ClientDisconnect:  # (RouteGuard ends a body that grows past the page's limit so)
            raise APIError(413, "Request too large", code="request_too_large") from None
        except RecursionError:  # a body of 100,000 nested lists: the parser's stack, not ours
            raise bad("the request body nests too deep: JSON of at most a few hundred levels is read") from None
        except (ValueError, UnicodeDecodeError):
            raise bad("the request body must be JSON") from None
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        if _ESCAPED_SURROGATE.search(raw):  # a "\ud800" escape: look for a lone one
            check_unicode_values(body)
        return body

    # ------------------------------------------------------------ the routes

    async def not_served(self, request: Request):
        """A /v1/ path or method Token Lab does not serve: 405 for a served path asked with
        another method, else 404; either names what is served."""
        path, method = request.url.path, request.method
        raise APIError(405 if path in SERVED else 404,
                       f"Token Lab does not serve {method} {path}; its API is "
                       + ", ".join(f"{m} {p}" for p, m in SERVED.items()) + " (see docs/openai_api.md)",
                       code="method_not_allowed" if path in SERVED else "not_found")

    async def models(self, request: Request):
        self.client(request)
        down = [self.offered.engine(name).down for name in self.offered.labels if self.offered.loaded(name)]
        if any(down):  # the engine cannot serve: said at once, not left to hang a client's run
            raise from_engine(next(d for d in down if d))
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "token-lab",
             **(self._loaded_info(name) if self.offered.loaded(name) else {})}
            for name in self.offered.labels]})

    def _loaded_info(self, name: str) -> dict:
        """A loaded model's context window and, for a quantized one on a CPU, its products (the
        path, the kernels and the bound: model/products.py)."""
        info = self.offered.engine(name).describe()
        return {"max_model_len": info.max_seq_len, **({"products": info.products} if info.products else {})}

    def _room(self, ids: list[int]) -> int:
        return self.context - len(ids)

    def _prompt(self, prompt) -> tuple[list[int], str]:
        """A completions prompt's ids and text: a text through the model's tokenizer (its BOS
        where the model wants one; control-token text as the token, as vLLM reads it), token ids
        as they are."""
        if isinstance(prompt, str):
            return self._ids(self.engine.prompt_ids, prompt, controls=True), prompt
        if len(prompt) >= self.context:
            raise bad(f"the prompt is {len(prompt)} tokens but the context window is {self.context}; shorten "
                      f"it by at least {len(prompt) - self.context + 1} tokens", "prompt")
        self._check_ids(prompt, "prompt")
        return prompt, self.engine.tokenizer.decode(prompt)

    @staticmethod
    def _ids(prompt_ids, *args, field: str = "prompt", **kw) -> list[int]:
        """The engine's prompt_ids(*args, **kw), its refusals (an empty prompt, one too long)
        naming the request's field."""
        try:
            return prompt_ids(*args, **kw)
        except InputError as e:
            raise InputError(str(e), field=e.field or field) from None

    def _check_ids(self, ids, key: str) -> None:
        vocab = self.engine.tokenizer.vocab_size  # (None: a server's tokenizer checks its own)
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                and (vocab is None or i < vocab) for i in ids):
            raise bad(f"{key} must be a list of token ids" + (f" in [0, {vocab})" if vocab else ""), key)

    def _prepare(self, jobs, top_n: int) -> list[RunRequest]:
        """Each completion's run prepared (prepare_run, as every door prepares one) before any
        answer is sent: what the engine refuses is the request's 400, never an error mid-stream."""
        return [prepare_run(self.engine, params, ids=ids, top_n=top_n) for ids, params in jobs]

    def _max_tokens(self, ask, ids_list, default: int | None) -> int:
        """The tokens each completion may make: asked, else the endpoint's default (None: the
        rest of the context window), within the page's cap. Asked for more than the context
        window leaves after the longest prompt: a 400, as OpenAI and vLLM answer, never a
        completion cut short at the window's end."""
        room = min(self._room(ids) for ids in ids_list)
        if ask.max_tokens is not None:
            if ask.max_tokens > room:
                longest = self.context - room
                raise bad(f"{ask.max_tokens_key} is {ask.max_tokens} but the context window of {self.context} "
                          f"tokens leaves {room} after the prompt's {longest}: ask for at most {room}",
                          ask.max_tokens_key)
            return ask.max_tokens
        n = room if default is None else min(default, room)
        cap = self.limits.max_new_tokens
        return max(1, min(n, cap) if cap is not None else n)

    async def completions(self, request: Request):
        client = self.client(request)
        body = await self.body(request)
        return await (await run_in_threadpool(self.pick, body))._completions(client, body, request.is_disconnected)

    async def _completions(self, client: str, body: dict, disconnected):
        prompts, ask = completion_ask(body, self.model, self.engine.generation_defaults,
                                      self.limits.max_new_tokens)
        prepared = [await run_in_threadpool(self._prompt, p) for p in prompts]
        ids_list = [ids for ids, _ in prepared]
        max_tokens = self._max_tokens(ask, ids_list, COMPLETIONS_MAX_TOKENS)
        if ask.beams:
            if len(ids_list) != 1:
                raise bad("use_beam_search takes one prompt", "prompt")
            return await self._beams(client, ids_list[0], ask, max_tokens, "completion", disconnected)
        choices = [(p, j) for p in range(len(prompts)) for j in range(ask.n)]
        names, cancels = self.start_jobs(client, len(choices))
        streaming = False
        try:
            scored = [None] * len(prompts)
            if ask.echo or ask.prompt_logprobs is not None:
                for ids in ids_list:  # each scored in one pass, its keys and values held: a shared page's bound
                    if (refusal := self.limits.score_refusal(len(ids))) is not None:
                        raise bad(refusal, "prompt")
                top = max((ask.logprobs or 0) if ask.echo else 0, ask.prompt_logprobs or 0)
                scored = [await run_in_threadpool(self.engine.prompt_logprobs, ids, top) for ids in ids_list]
            known = [(ids, s, text) if s is not None else None for (ids, text), s in zip(prepared, scored)]
            jobs = await run_in_threadpool(self._prepare, [(ids_list[p], ask.seeded(j, max_tokens)) for p, j in choices]
                                           if max_tokens else [], _top_n(ask))
            runs = Runs(self.engine, jobs, cancels[:len(jobs)])
            writer = Writer(self.model, self.engine.tokenizer, ask, "completion")
            n_prompt = sum(len(ids) for ids in ids_list)  # each prompt once, however many completions (OpenAI's, vLLM's)
            if ask.stream:
                response = await self._stream(self._completion_chunks(writer, runs, choices, known, n_prompt, ask),
                                              names, cancels)
                streaming = True
                return response
            steps, done = await collect(runs, len(jobs), disconnected)
            out = [writer.completion_choice(c, steps.get(c, []), done.get(c), known[p]) for c, (p, _) in enumerate(choices)]
            generated = sum(d.generated_tokens for d in done.values())
            return JSONResponse(writer.envelope(out, usage=usage(n_prompt, generated)))
        finally:
            if not streaming:
                self.finish_jobs(names, cancels)

    async def _beams(self, client: str, ids: list[int], ask, max_tokens: int, kind: str, disconnected):
        """use_beam_search: one beam search of width n beside everyone's runs (one job); its
        finished beams, best first, are the choices."""
        names, cancels = self.start_jobs(client, 1)
        try:
            jobs = await run_in_threadpool(self._prepare, [(ids, ask.seeded(0, max_tokens))], 0)
            _, done = await collect(Runs(self.engine, jobs, cancels), 1, disconnected)
            end, writer = done[0], Writer(self.model, self.engine.tokenizer, ask, kind)
            if end.reason == UNSCORED:  # no choice to give: an error that says why, never choices []
                raise bad(unscored_message(end.length_penalty), "length_penalty")
            choices = [writer.beam_choice(i, beam, text) for i, (beam, text) in enumerate(zip(end.beams, end.texts))]
            return JSONResponse(writer.envelope(choices, usage=usage(len(ids), sum(len(b.tokens) for b in end.beams))))
        finally:
            self.finish_jobs(names, cancels)

    async def _completion_chunks(self, writer, runs, choices, known, n_prompt, ask):
        """(chunk, written before any run's event)."""
        for c, (p, _) in enumerate(choices):
            if known[p] is not None:
                yield writer.completion_prompt_chunk(c, known[p]), True
        generated = [0]
        if runs.jobs:
            async for item in run_chunks(runs, writer, writer.completion_step_chunk, writer.completion_done_chunk, generated):
                yield item
        else:  # max_tokens 0: the prompt only
            for c in range(len(choices)):
                yield writer.envelope([{"index": c, "text": "", "logprobs": None, "finish_reason": "length",
                                        "stop_reason": None}], chunk=True), False
        if ask.include_usage:
            yield writer.usage_chunk(usage(n_prompt, generated[0])), False

    async def chat(self, request: Request):
        client = self.client(request)
        body = await self.body(request)
        return await (await run_in_threadpool(self.pick, body))._chat(client, body, request.is_disconnected)

    async def _chat(self, client: str, body: dict, disconnected):
        chat, ask = chat_ask(body, self.model, self.engine.generation_defaults, self.limits.max_new_tokens)
        ids = await run_in_threadpool(self._ids, self.engine.prompt_ids, chat["prompt"], True, chat["system"],
                                      chat["history"], controls=True, field="messages")
        max_tokens = self._max_tokens(ask, [ids], None)
        if ask.beams:
            return await self._beams(client, ids, ask, max_tokens, "chat", disconnected)
        names, cancels = self.start_jobs(client, ask.n)
        streaming = False
        try:
            jobs = await run_in_threadpool(self._prepare, [(ids, ask.seeded(j, max_tokens)) for j in range(ask.n)],
                                           _top_n(ask))
            runs = Runs(self.engine, jobs, cancels)
            writer = Writer(self.model, self.engine.tokenizer, ask, "chat")
            if ask.stream:
                response = await self._stream(self._chat_chunks(writer, runs, len(ids), ask), names, cancels)
                streaming = True
                return response
            steps, done = await collect(runs, ask.n, disconnected)
            out = [writer.chat_choice(c, steps[c], done[c]) for c in range(ask.n)]
            generated = sum(d.generated_tokens for d in done.values())
            return JSONResponse(writer.envelope(out, usage=usage(len(ids), generated)))
        finally:
            if not streaming:
                self.finish_jobs(names, cancels)

    async def _chat_chunks(self, writer, runs, n_prompt, ask):
        """(chunk, written before any run's event)."""
        for c in range(len(runs.jobs)):
            yield writer.chat_role_chunk(c), True
        generated = [0]
        async for item in run_chunks(runs, writer, writer.chat_step_chunk, writer.chat_done_chunk, generated):
            yield item
        if ask.include_usage:
            yield writer.usage_chunk(usage(n_prompt, generated[0])), False

    async def _stream(self, chunks, names, cancels) -> StreamingResponse:
        """The chunks as server-sent events, ending with `data: [DONE]`. The first chunk of the
        runs is waited for before the answer starts, so that a setting the engine refuses is
        still a 400; an error after that is an error event, as vLLM sends it."""
        first = []
        async for obj, opening in chunks:
            first.append(obj)
            if not opening:
                break

        async def events():
            try:
                for obj in first:
                    yield sse(obj)
                try:
                    async for obj, _ in chunks:
                        yield sse(obj)
                except TokenLabError as e:
                    err = from_engine(e)
                    yield sse(error_body(err.message, err.type, err.param, err.status))
                yield "data: [DONE]\n\n"
            finally:
                await chunks.aclose()

        return ClosingStream(events(), lambda: self.finish_jobs(names, cancels), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # ------------------------------------------------------------ vLLM's tokenizer routes

    async def tokenize(self, request: Request):
        """vLLM's /tokenize: {"prompt"} (add_special_tokens true: BOS where the model wants it;
        false: the text as a continuation of earlier text) or {"messages"} through the chat
        template, as a chat completion's prompt."""
        self.client(request)
        body = await self.body(request)
        return await (await run_in_threadpool(self.pick, body))._tokenize(body)

    async def _tokenize(self, body: dict):
        check_model(body, self.model)
        if "messages" in body:
            check_fields(body, {"model", "messages", "add_generation_prompt"}, served=TOKENIZE_SERVED)
            if body.get("add_generation_prompt", True) is not True:
                raise bad("add_generation_prompt false is not served", "add_generation_prompt")
            chat = chat_arguments(body["messages"])
            ids = await run_in_threadpool(self._ids, self.engine.prompt_ids, chat["prompt"], True, chat["system"],
                                          chat["history"], controls=True, field="messages")
        else:
            check_fields(body, {"model", "prompt", "add_special_tokens"}, served=TOKENIZE_SERVED)
            text = body.get("prompt")
            if not isinstance(text, str):
                raise bad("prompt must be text", "prompt")
            special = body.get("add_special_tokens", True)
            if not isinstance(special, bool):
                raise bad(f"add_special_tokens must be true or false, got {shown(special)}", "add_special_tokens")
            tok = self.engine.tokenizer
            self.engine.check_prompt_size(text)  # by its length, before any tokenizing
            ids = await run_in_threadpool(tok.encode if special else tok.encode_continuation, text, controls=True)
        return JSONResponse({"count": len(ids), "max_model_len": self.context, "tokens": ids})

    async def detokenize(self, request: Request):
        self.client(request)
        body = await self.body(request)
        return await (await run_in_threadpool(self.pick, body))._detokenize(body)

    async def _detokenize(self, body: dict):
        ids = body.get("tokens")
        self._check_ids(ids, "tokens")
        if len(ids) > self.context:
            raise bad(f"at most {self.context} tokens (the context window)", "tokens")
        return JSONResponse({"prompt": self.engine.tokenizer.decode(ids)})

    async def tokenizer_info(self, request: Request):
        """vLLM's /tokenizer_info: the special tokens and the chat template."""
        self.client(request)
        tok = self.engine.tokenizer
        return JSONResponse({"tokenizer_class": "TokenLab", "model_max_length": self.context,
                             "bos_token": tok.bos_token, "eos_token": tok.eos_token,
                             "chat_template": tok.chat_template})


def _top_n(ask) -> int:
    """Candidates the engine reports per step: at least one when log-probabilities are asked
    for (0 skips the step's statistics altogether)."""
    return 0 if ask.logprobs is None else max(1, ask.logprobs)
