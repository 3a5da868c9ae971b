"""RemoteEngine: the engine's public methods, served by a vLLM server over its OpenAI-compatible
API (`--engine-url http://HOST:PORT/v1`), for a model too big for this machine or more visitors
than it can serve.

What it gives: the prompt's ids (the server's /tokenize, its chat template), streamed tokens
with the server's log-probabilities of the top candidates (remote_steps.py says which
distribution they are), teacher-forced scores (prompt log-probabilities), the server's own load
(/metrics). What it cannot give is None in every event, never made up: the entropy over the whole
vocabulary, ranks beyond the returned candidates, this run's KV-cache bytes, stored logits; and
what needs the model's insides (attention, logit lens, replay) raises NotAvailable.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from typing import Iterator

from inference.loading.chat import chat_messages
from inference.model.config import ModelConfig
from inference.contract import EngineInfo
from inference.errors import EngineClosed, InputError, NotAvailable, ServerError
from inference.events import DoneEvent, PromptToken, StepEvent, TokenScore, token_scores
from inference.request import RunRequest, prepare_run
from inference.samples import first_seed, merged
from inference.remote.steps import MODES, candidates, meaning, split_text, token_numbers
from inference.remote.discovery import pick_model, probe_logprobs_mode, read_config, server_info
from inference.remote.http import ServerHTTP
from inference.remote.tokenizer import RemoteTokenizer, token_ids
from inference.remote.metrics import ServerLoad, kv_bytes_per_value, parse_load
from inference.sampling.settings import BY_NAME, SETTINGS

INSIDES = "not available when the page is in front of a server"
# Prompts whose ids are kept (a chat's next turn and a replay ask for the same ones again);
# all are dropped when there are this many, so a stream of visitors' prompts is not kept.
PROMPTS_KEPT = 32
REPLAY = ("replay recomputes a step from its whole logit vector; the server returns only the top "
          f"candidates: {INSIDES}")


class RemoteEngine:
    """The Engine's public methods (prompt_ids, prompt_text, generate, generate_ids, score,
    describe, capture, replay) in front of a vLLM server. Holds no model: each run is one
    streamed request, and stopping a run closes its connection, which aborts it on the server.
    close() (or a with block) aborts the open streams and joins the threads that watch them."""

    def __init__(self, http: ServerHTTP, model: str, max_seq_len: int, logprobs: str,
                 logprobs_source: str, cfg: ModelConfig | None = None,
                 config_source: str | None = None, config_dtype: str | None = None,
                 generation_defaults: dict | None = None):
        self.http, self.name = http, model
        self.tokenizer = RemoteTokenizer(http, model)
        self.cfg = cfg
        self.generation_defaults = generation_defaults or {}
        self.info = server_info(model, http.url, max_seq_len, logprobs, logprobs_source, cfg,
                               config_source, config_dtype)
        self._active = 0
        self._active_lock = threading.Lock()
        self._prompts: dict[tuple, list[int]] = {}  # recent prompts' ids, at most PROMPTS_KEPT
        self._closed = threading.Event()
        self._streams: set = set()  # open EventStreams, aborted by close()
        self._watchers: set[threading.Thread] = set()  # each run's cancel watcher

    @classmethod
    def connect(cls, url: str, model: str | None = None, config: str | None = None,
                logprobs: str = "auto", timeout_s: float = 120.0) -> "RemoteEngine":
        """Ask the server what it serves, read the model's config.json where there is one (given,
        or at the path the server loaded it from, when that path is on this machine), and find
        out which distribution its log-probabilities are (unless `logprobs` says)."""
        if logprobs not in ("auto", *MODES):
            raise InputError(f"--engine-logprobs must be auto, raw or processed, got {logprobs!r}")
        http = ServerHTTP(url, timeout_s)
        entry = pick_model(http.get_json("/models"), model, http.url)
        served = entry["id"]
        max_len = entry.get("max_model_len")
        cfg, source, dtype, gen = read_config(config, entry.get("root"))
        if not isinstance(max_len, int) or max_len <= 0:
            if cfg is None:
                raise ServerError(f"the model server at {http.url} does not say its context "
                                  "window (max_model_len); give the model's config with --engine-config PATH")
            max_len = cfg.max_seq_len
        if logprobs == "auto":
            mode, how = probe_logprobs_mode(http, served), "probed at start"
        else:
            mode, how = logprobs, "given with --engine-logprobs"
        engine = cls(http, served, max_len, mode, how, cfg, source, dtype, gen)
        try:  # the server's KV-cache dtype, for the formula's bytes per value
            load = engine.server_load()
        except ServerError:
            load = None
        b, why = engine.kv_bytes_per_value(load)
        engine.info = replace(engine.info, kv_value_bytes=b, kv_value_bytes_source=why)
        return engine

    # ------------------------------------------------------------ shutting down

    def close(self) -> None:
        """Refuse new runs and scores, abort every open stream (its run ends "cancelled", the
        server aborts the request) and join the threads watching runs' cancel flags. Idempotent."""
        self._closed.set()
        with self._active_lock:
            streams, watchers = list(self._streams), list(self._watchers)
        for stream in streams:
            stream.abort()
        for t in watchers:
            if t is not threading.current_thread():
                t.join()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise EngineClosed("the engine is closed: it starts no more work")

    # ------------------------------------------------------------ what the engine is

    def describe(self) -> EngineInfo:
        return self.info

    @property
    def default_system_prompt(self) -> str:
        """The server applies its own chat template: no default is known here."""
        return ""

    @property
    def max_seq_len(self) -> int:
        """The server's context window."""
        return self.info.max_seq_len

    @property
    def active_runs(self) -> int:
        return self._active

    def server_load(self) -> ServerLoad:
        """The whole server's KV-cache use and queue, from its /metrics."""
        return parse_load(self.http.get_text("/metrics", root=True, timeout_s=5.0), self.name)

    def kv_bytes_per_value(self, load: ServerLoad | None) -> tuple[int | None, str]:
        values = 2 * self.cfg.n_layers * self.cfg.n_kv_heads * self.cfg.head_dim if self.cfg else None
        return kv_bytes_per_value(load, values, self.info.config_dtype)

    # ------------------------------------------------------------ prompt -> ids

    def prompt_text(self, prompt: str, chat: bool = False, system: str | None = None,
                    history: list[dict] | None = None) -> str:
        check_prompt_text(prompt, chat)
        if not chat:
            return prompt
        return self.tokenizer.decode(self.prompt_ids(prompt, chat, system, history))

    def prompt(self, prompt: str, chat: bool = False, system: str | None = None,
               history: list[dict] | None = None, controls: bool = False) -> tuple[str, list[int]]:
        """prompt_text and prompt_ids (the server's tokenization, asked once: it is kept)."""
        ids = self.prompt_ids(prompt, chat, system, history, controls)
        return (self.tokenizer.decode(ids) if chat else prompt), ids

    def prompt_ids(self, prompt: str, chat: bool = False, system: str | None = None,
                   history: list[dict] | None = None, controls: bool = False) -> list[int]:
        """The ids the server feeds the model: its tokenizer, and in chat mode its chat template
        (over the earlier turns of `history` too). Control-token text is read as the server's
        tokenizer reads it, whatever `controls` says (vLLM's: as the token)."""
        check_prompt_text(prompt, chat)
        messages = chat_messages(prompt, system, history) if chat else None
        key = (prompt, chat, system, repr(messages))
        ids = self._prompts.get(key)
        if ids is None:
            if chat:
                body = {"model": self.name, "messages": messages, "add_generation_prompt": True}
                ids = token_ids(self.http.post_json("/tokenize", body, root=True))
            else:
                ids = self.tokenizer.encode(prompt)
            if len(self._prompts) >= PROMPTS_KEPT:
                self._prompts.clear()
            self._prompts[key] = ids
        n = self.max_seq_len
        if len(ids) >= n:
            raise InputError(f"the prompt is {len(ids)} tokens but the context window is {n}; "
                             f"shorten it by at least {len(ids) - n + 1} tokens")
        return list(ids)

    # ------------------------------------------------------------ scoring

    def score(self, context_ids: list[int], continuation: str) -> list[tuple[int, str, float]]:
        """Teacher-forced log-probabilities of continuation's tokens after context_ids: the
        server's prompt log-probabilities (the model's own distribution in every logprobs mode)."""
        self._check_open()
        cont = self.tokenizer.encode_continuation(continuation) if continuation else []
        if not cont:
            raise InputError("the continuation is empty")
        if not context_ids:
            raise InputError("the context is empty: scoring needs at least one token before")
        ids = list(context_ids) + cont
        if len(ids) >= self.max_seq_len:  # the server generates one token after them
            raise InputError(f"context and continuation are {len(ids)} tokens but the context "
                             f"window is {self.max_seq_len}")
        scored = self.prompt_logprobs(ids)[len(context_ids) - 1:]
        pieces = self.tokenizer.pieces(cont)
        return [(t.token_id, pieces[t.token_id], t.logprob) for t in scored]

    def prompt_logprobs(self, ids: list[int], top_n: int = 0) -> list[PromptToken]:
        """Every token of ids after the first, teacher-forced: the server's prompt
        log-probabilities (the model's own distribution in every logprobs mode), each token's
        rank and its top_n candidates there."""
        self._check_open()
        if not ids:
            raise InputError("the prompt is empty")
        body = {"model": self.name, "prompt": list(ids), "max_tokens": 1, "temperature": 0,
                "prompt_logprobs": max(0, top_n)}
        answer = self.http.post_json("/completions", body)
        out = []
        try:
            per_position = answer["choices"][0]["prompt_logprobs"]
            for k in range(1, len(ids)):
                entries = per_position[k]
                chosen = entries[str(ids[k])]
                top = sorted(((int(i), float(e["logprob"])) for i, e in entries.items()),
                             key=lambda e: (-e[1], e[0]))[:top_n]
                rank = chosen.get("rank")
                out.append(PromptToken(ids[k], float(chosen["logprob"]), int(rank) if isinstance(rank, int) else None,
                                       top))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise ServerError("the model server's answer has no prompt log-probabilities "
                              "(prompt_logprobs); Token Lab needs vLLM's OpenAI API") from None
        return out

    def text_ids(self, text: str) -> tuple[list[int], int]:
        """The ids the server feeds a text as (its special tokens added), and how many come
        before the text's own tokens (the server's tokens with and without them compared)."""
        if not isinstance(text, str) or not text:
            raise InputError("the text is empty")
        ids, plain = self.tokenizer.encode(text), self.tokenizer.encode(text, add_bos=False)
        before = len(ids) - len(plain)
        return ids, before if before >= 0 and ids[before:before + len(plain)] == plain else 0

    def score_ids(self, ids: list[int], top_n: int = 10) -> list[TokenScore]:
        """Every token of ids given those before it: the server's prompt log-probabilities (the
        model's own distribution), with the rank it gives each token and its top_n."""
        self._check_open()
        ids = list(ids)
        if not ids:
            raise InputError("the text is empty")
        if len(ids) >= self.max_seq_len:  # the server generates one token after them
            raise InputError(f"the text is {len(ids)} tokens but the context window is {self.max_seq_len}")
        scored = self.prompt_logprobs(ids, top_n) if len(ids) > 1 else []
        return token_scores(ids, scored, self.tokenizer.pieces(ids + [j for p in scored for j, _ in p.top]))

    # ------------------------------------------------------------ generation

    def generate(self, req, cancel: threading.Event | None = None) -> Iterator[StepEvent | DoneEvent]:
        return self.run(prepare_run(self, req.params, prompt=req.prompt, chat=req.chat, system=req.system,
                                    top_n=req.top_n), cancel)

    def generate_ids(self, ids: list[int], params, top_n: int = 10,
                     cancel: threading.Event | None = None, given: list[int] = ()
                     ) -> Iterator[StepEvent | DoneEvent]:
        """`run` of the request prepare_run makes of these ids and settings."""
        yield from self.run(prepare_run(self, params, ids=ids, given=given, top_n=top_n), cancel)

    def check_run(self, request: RunRequest) -> None:
        """The server reads given tokens (a branch's) as prompt: a setting that counts generated
        tokens apart from the prompt's (presence and frequency penalties) is refused with them."""
        p = request.params
        if request.forced:
            raise InputError("a model server draws its own tokens: a run of given tokens needs a local model")
        if request.given and (p.presence_penalty or p.frequency_penalty):
            raise InputError("a branch in front of a server cannot use presence or frequency penalties: the "
                             "server would count its given tokens as prompt, not as generated")

    @property
    def vocab_size(self) -> int | None:
        """The served model's vocabulary, where its config is known here."""
        return self.info.cfg.vocab_size if self.info.cfg is not None else None

    @property
    def down(self):
        """A server's failures are each request's own (a ServerError): the page never goes down."""
        return None

    def run(self, request: RunRequest, cancel: threading.Event | None = None) -> Iterator[StepEvent | DoneEvent]:
        """One streamed request. Setting `cancel` (or closing this generator) closes the
        connection, which aborts the request on the server. Times are measured here, at the
        page: they include the network and the server's queue."""
        params, ids = request.params, request.ids
        body = {"model": self.name, "prompt": ids,
                **server_settings(params, self.tokenizer, max_new_tokens=request.max_new),
                "stream": True, "seed": request.seed, "stop": list(params.stop),
                # Token ids, not strings: two tokens may spell the same text.
                "return_token_ids": True, "return_tokens_as_token_ids": True,
                # Special tokens' text is output, as the local engine does (EOS never is).
                "skip_special_tokens": False, "spaces_between_special_tokens": False}
        if request.top_n > 0:
            body["logprobs"] = request.top_n
        return self._run(body, len(ids), request.max_new, request.capped, request.seed, request.top_n,
                         meaning(self.info.capabilities.logprobs, params), cancel)

    def generate_many(self, ids: list[int], params, n: int, top_n: int = 10,
                      cancel: threading.Event | None = None):
        """n samples: n streamed requests at once, sample k with seed s + k (the server batches
        them); (k, event) as each arrives, until all have ended."""
        seed = first_seed(params.seed, n)
        cancel = cancel or threading.Event()
        shared: queue.Queue = queue.Queue()

        def pump(k: int) -> None:
            try:
                for ev in self.generate_ids(ids, replace(params, seed=seed + k), top_n, cancel):
                    shared.put((k, ev))
            except BaseException as e:  # handed to the reader, who raises it
                shared.put((k, e))

        threads = [threading.Thread(target=pump, args=(k,), daemon=True, name="tokenlab-remote-sample")
                   for k in range(n)]
        try:
            for t in threads:
                t.start()
            yield from merged(shared, n)
        finally:  # the reader stopped early: the samples still streaming close their connections
            if any(t.is_alive() for t in threads):
                cancel.set()
            for t in threads:
                if t.ident is not None:  # started
                    t.join()

    def _run(self, body, n_prompt, max_new, capped, seed, top_n, m, cancel):
        self._check_open()
        # The mass a constraint removed is not reported by the server (None); without one it is 0.
        masked = None if "structured_outputs" in body else 0.0
        with self._active_lock:
            self._active += 1
        t0 = time.perf_counter()
        stream, ended, watcher = None, threading.Event(), None
        parts: list[str] = []
        arrivals: list[float] = []
        step, tail, reason, stop_string = 0, "", None, None

        def stopped() -> bool:
            return self._closed.is_set() or (cancel is not None and cancel.is_set())

        try:
            stream = self.http.stream("/completions", body)
            with self._active_lock:
                self._streams.add(stream)
                if cancel is not None:
                    watcher = threading.Thread(target=_abort_on, args=(cancel, ended, stream, self._closed),
                                               daemon=True, name="tokenlab-remote-cancel")
                    self._watchers.add(watcher)
                    watcher.start()
            if self._closed.is_set():  # closed while the request was being sent
                stream.abort()
            for chunk in stream:
                if stopped():
                    break
                choices = chunk.get("choices") or []
                if not choices:
                    continue  # a usage-only chunk
                choice = choices[0]
                new_ids = choice.get("token_ids") or []
                text = choice.get("text") or ""
                now = time.perf_counter()
                if not new_ids:
                    tail += text  # text released without a new token (held-back text at the end)
                else:
                    logprobs = choice.get("logprobs") or {}
                    tops = logprobs.get("top_logprobs") or [None] * len(new_ids)
                    chosen_lps = logprobs.get("token_logprobs") or [None] * len(new_ids)
                    numbers = [token_numbers(t, chosen_lps[j], tops[j], top_n, m)
                               for j, t in enumerate(new_ids)]
                    pieces = self.tokenizer.pieces(
                        list(new_ids) + [i for nb in numbers for i, _, _ in nb.top])
                    texts = split_text(text, [pieces[t] for t in new_ids])
                    for j, t in enumerate(new_ids):
                        nb = numbers[j]
                        # Tokens that arrive together: the first carries the wait, the rest 0 ms.
                        ms = (now - (arrivals[-1] if arrivals else t0)) * 1000 if j == 0 else 0.0
                        arrivals.append(now)
                        parts.append(texts[j])
                        yield StepEvent(
                            step=step, token_id=t, piece=pieces[t], text=texts[j], prob=nb.prob,
                            raw_prob=nb.raw_prob, top=candidates(nb.top, pieces, masked is None), entropy=None,
                            rank=nb.rank, kv_cache_bytes=None, kv_cache_capacity_bytes=None,
                            ms=ms, prefill_ms=ms if step == 0 else None,
                            prompt_tokens=n_prompt if step == 0 else None, kv_blocks=None,
                            masked_mass=masked)
                        step += 1
                if choice.get("finish_reason") is not None:
                    reason = _reason(choice, capped, step, max_new)
                    if reason == "stop":
                        stop_string = choice.get("stop_reason")
            if (cancel is not None and cancel.is_set()) or (reason is None and self._closed.is_set()):
                reason = "cancelled"
            elif reason is None:
                raise ServerError(f"the model server at {self.http.url} ended its answer without "
                                  "saying why (no finish_reason)")
        finally:  # also reached when the consumer closes the generator (Stop, a closed tab)
            ended.set()
            if stream is not None:
                stream.abort()
            with self._active_lock:
                self._active -= 1
                self._streams.discard(stream)
                self._watchers.discard(watcher)
        decode_s = (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else 0.0
        yield DoneEvent(
            reason=reason, text="".join(parts) + tail, tail=tail, prompt_tokens=n_prompt,
            generated_tokens=step, ttft_ms=(arrivals[0] - t0) * 1000 if arrivals else 0.0,
            decode_tokens_per_s=(len(arrivals) - 1) / decode_s if decode_s > 0 else 0.0,
            seed=seed, max_new_tokens=max_new, capped=capped, stop_string=stop_string)

    # ------------------------------------------------------------ looking inside a step

    def capture(self, context_ids, layer):
        raise NotAvailable("the attention weights and the logit lens need the model's "
                                 f"activations: {INSIDES}")

    def step_logits(self, context_ids):
        raise NotAvailable(REPLAY)

    def logits_along(self, ids, first):
        raise NotAvailable(REPLAY)

    def replay(self, logits, params, state, chosen, shown=None):
        raise NotAvailable(REPLAY)

    def expand_tree(self, ids, given=(), **tree):
        raise NotAvailable("a tree of continuations needs the model's whole distribution at each node, and a "
                           "server's log-probabilities list a few tokens (capabilities.tree)")


# ---------------------------------------------------------------- helpers

def check_prompt_text(prompt, chat: bool) -> None:
    """A prompt is text; empty only as a chat message (the template's turn around it is not)."""
    if not isinstance(prompt, str) or not (chat or prompt.strip()):
        raise InputError("the prompt is empty")


def server_settings(params, tokenizer=None, **given) -> dict:
    """The request's sampling fields, each under the key the schema gives for a server (values
    in `given` by setting name replace the run's). A setting no server takes is refused unless
    it asks for nothing (its neutral value, or its default for the order and for the parameters
    of a stage that is off): the run would otherwise not be the one asked for."""
    out = {}
    values = {s.name: given.get(s.name, getattr(params, s.name)) for s in SETTINGS}
    for s in SETTINGS:
        value = values[s.name]
        if s.server_key is not None:
            if s.kind is not str or value != s.off:
                out[s.server_key] = s.server_form(value, tokenizer, values) if s.server_form else value
        elif value != s.off and not s.sent_by_stage and not (s.part_of and values[s.part_of] == BY_NAME[s.part_of].neutral):
            raise NotAvailable(f"{s.label.lower()} is not available in front of a model server ({s.flag})")
    return out


def _abort_on(cancel: threading.Event, ended: threading.Event, stream, closed: threading.Event) -> None:
    """Close the stream as soon as `cancel` is set; return once the run has ended or the engine
    is closed (which aborts the stream itself)."""
    while not ended.is_set() and not closed.is_set():
        if cancel.wait(0.25):
            stream.abort()
            return


def _reason(choice: dict, capped: bool, steps: int, max_new: int) -> str:
    """vLLM's finish_reason as the engine's: 'stop' with no stop_reason (or a stop token id)
    is the end-of-sequence token, with a string it is that stop string."""
    finish = choice.get("finish_reason")
    if finish == "length":
        return "context" if capped and steps >= max_new else "length"
    if finish == "stop":
        return "stop" if isinstance(choice.get("stop_reason"), str) else "eos"
    if finish == "abort":
        raise ServerError("the model server aborted the request (it may be shutting down or out "
                          "of KV-cache memory)")
    raise ServerError(f"the model server ended the run with finish_reason {finish!r}")
