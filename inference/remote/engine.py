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

import math
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from inference.loading.chat import chat_messages
from inference.model.config import ModelConfig
from inference.contract import Capabilities, EngineInfo
from inference.errors import EngineClosed, InputError, ModelError, NotAvailable, ServerError
from inference.events import DoneEvent, StepEvent
from inference.remote.steps import MODES, candidates, meaning, split_text, token_numbers
from inference.remote.http import ServerHTTP
from inference.remote.metrics import ServerLoad, kv_bytes_per_value, parse_load

INSIDES = "not available when the page is in front of a server"
# Prompts whose ids are kept (a chat's next turn and a replay ask for the same ones again);
# all are dropped when there are this many, so a stream of visitors' prompts is not kept.
PROMPTS_KEPT = 32
REPLAY = ("replay recomputes a step from its whole logit vector; the server returns only the top "
          f"candidates: {INSIDES}")


def server_info(name: str, url: str, max_seq_len: int, logprobs: str, logprobs_source: str,
                cfg: ModelConfig | None = None, config_source: str | None = None,
                config_dtype: str | None = None, kv_bytes: int | None = None,
                kv_bytes_source: str = "") -> EngineInfo:
    """A served model's EngineInfo. logprobs: "raw" or "processed", which distribution the
    server's numbers are; kv_bytes: bytes per KV-cache value on the server, where known."""
    caps = Capabilities(internals=False, whole_distribution=False, measured_kv=False, server_load=True,
                        logprobs=logprobs, local_timing=False)
    return EngineInfo(name, max_seq_len, cfg, caps, url, kv_bytes, kv_bytes_source,
                      logprobs_source=logprobs_source, config_source=config_source, config_dtype=config_dtype)


class RemoteTokenizer:
    """The served model's tokenizer, through the server: /tokenize, and each token's piece from
    /detokenize (cached: a piece never changes)."""

    def __init__(self, http: ServerHTTP, model: str):
        self._http, self._model = http, model
        self._pieces: dict[int, str] = {}  # at most one a token of the vocabulary
        self._lock = threading.Lock()
        self._prefix: tuple[int, str] | None = None

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Ids as the server feeds the model (add_bos=False: no special tokens added)."""
        body = {"model": self._model, "prompt": text, "add_special_tokens": add_bos is not False}
        return _ids(self._http.post_json("/tokenize", body, root=True))

    def encode_continuation(self, text: str) -> list[int]:
        return self.encode(text, add_bos=False)

    def decode(self, ids: list[int]) -> str:
        return _text(self._http.post_json("/detokenize", {"model": self._model, "tokens": list(ids)},
                                          root=True))

    def piece(self, token_id: int) -> str:
        return self.pieces([token_id])[token_id]

    def char_groups(self, ids: list[int]) -> list[tuple[range, bool]]:
        """Each token on its own: the server does not give a token's bytes, so byte tokens of
        one character are not grouped (their text arrives whole with the last of them)."""
        return [(range(i, i + 1), True) for i in range(len(ids))]

    def is_control(self, token_id: int) -> bool:
        """Not known: the server does not say which tokens are control tokens."""
        return False

    def pieces(self, ids) -> dict[int, str]:
        """{id: piece} for ids, fetching the ones not seen yet (a few requests at a time)."""
        missing = [i for i in dict.fromkeys(ids) if i not in self._pieces]
        if len(missing) > 4:
            with ThreadPoolExecutor(4) as pool:
                found = list(pool.map(self._fetch_piece, missing))
        else:
            found = [self._fetch_piece(i) for i in missing]
        with self._lock:
            self._pieces.update(zip(missing, found))
            return {i: self._pieces[i] for i in ids}

    def _fetch_piece(self, token_id: int) -> str:
        # Decoded after a fixed token and cut after that token's text: a sentencepiece decoder
        # drops the leading space of the first token only, so " Paris" keeps its space.
        if self._prefix is None:
            first = self.encode("a", add_bos=False)[:1]
            self._prefix = (first[0], self.decode(first)) if first else (-1, "")
        pid, ptext = self._prefix
        if pid >= 0:
            text = self.decode([pid, token_id])
            if text.startswith(ptext):
                return text[len(ptext):]
        return self.decode([token_id])


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
        entry = _pick_model(http.get_json("/models"), model, http.url)
        served = entry["id"]
        max_len = entry.get("max_model_len")
        cfg, source, dtype, gen = _read_config(config, entry.get("root"))
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
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError("the prompt is empty")
        if not chat:
            return prompt
        return self.tokenizer.decode(self.prompt_ids(prompt, chat, system, history))

    def prompt_ids(self, prompt: str, chat: bool = False, system: str | None = None,
                   history: list[dict] | None = None) -> list[int]:
        """The ids the server feeds the model: its tokenizer, and in chat mode its chat template
        (over the earlier turns of `history` too)."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError("the prompt is empty")
        messages = chat_messages(prompt, system, history) if chat else None
        key = (prompt, chat, system, repr(messages))
        ids = self._prompts.get(key)
        if ids is None:
            if chat:
                body = {"model": self.name, "messages": messages, "add_generation_prompt": True}
                ids = _ids(self.http.post_json("/tokenize", body, root=True))
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
        body = {"model": self.name, "prompt": ids, "max_tokens": 1, "temperature": 0,
                "prompt_logprobs": 0}
        answer = self.http.post_json("/completions", body)
        try:
            per_position = answer["choices"][0]["prompt_logprobs"]
            picked = [float(per_position[k][str(ids[k])]["logprob"])
                      for k in range(len(context_ids), len(ids))]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError("the model server's answer has no prompt log-probabilities "
                              "(prompt_logprobs); Token Lab needs vLLM's OpenAI API") from None
        pieces = self.tokenizer.pieces(cont)
        return [(i, pieces[i], lp) for i, lp in zip(cont, picked)]

    # ------------------------------------------------------------ generation

    def generate(self, req, cancel: threading.Event | None = None) -> Iterator[StepEvent | DoneEvent]:
        ids = self.prompt_ids(req.prompt, req.chat, req.system)
        return self.generate_ids(ids, req.params, req.top_n, cancel)

    def generate_ids(self, ids: list[int], params, top_n: int = 10,
                     cancel: threading.Event | None = None) -> Iterator[StepEvent | DoneEvent]:
        """One streamed request. Setting `cancel` (or closing this generator) closes the
        connection, which aborts the request on the server. Times are measured here, at the
        page: they include the network and the server's queue."""
        n_prompt = len(ids)
        max_new = min(params.max_new_tokens, self.max_seq_len - n_prompt)
        if max_new < 1:
            raise InputError(f"the prompt is {n_prompt} tokens and fills the context window of "
                             f"{self.max_seq_len}")
        capped = max_new < params.max_new_tokens
        seed = params.seed if params.seed is not None else secrets.randbelow(2**31)
        body = {"model": self.name, "prompt": list(ids), "max_tokens": max_new, "stream": True,
                "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                "min_p": params.min_p, "repetition_penalty": params.repetition_penalty,
                "seed": seed, "stop": list(params.stop),
                # Token ids, not strings: two tokens may spell the same text.
                "return_token_ids": True, "return_tokens_as_token_ids": True,
                # Special tokens' text is output, as the local engine does (EOS never is).
                "skip_special_tokens": False, "spaces_between_special_tokens": False}
        if top_n > 0:
            body["logprobs"] = top_n
        return self._run(body, n_prompt, max_new, capped, seed, top_n,
                         meaning(self.info.capabilities.logprobs, params), cancel)

    def _run(self, body, n_prompt, max_new, capped, seed, top_n, m, cancel):
        self._check_open()
        with self._active_lock:
            self._active += 1
        t0 = time.perf_counter()
        stream, ended, watcher = None, threading.Event(), None
        parts: list[str] = []
        arrivals: list[float] = []
        step, tail, reason = 0, "", None

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
                            raw_prob=nb.raw_prob, top=candidates(nb.top, pieces), entropy=None,
                            rank=nb.rank, kv_cache_bytes=None, kv_cache_capacity_bytes=None,
                            ms=ms, prefill_ms=ms if step == 0 else None,
                            prompt_tokens=n_prompt if step == 0 else None, kv_blocks=None)
                        step += 1
                if choice.get("finish_reason") is not None:
                    reason = _reason(choice, capped, step, max_new)
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
            seed=seed, max_new_tokens=max_new, capped=capped)

    # ------------------------------------------------------------ looking inside a step

    def capture(self, context_ids, layer):
        raise NotAvailable("the attention weights and the logit lens need the model's "
                                 f"activations: {INSIDES}")

    def step_logits(self, context_ids):
        raise NotAvailable(REPLAY)

    def replay(self, logits, params, seen_ids, chosen):
        raise NotAvailable(REPLAY)


# ---------------------------------------------------------------- helpers

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


def _ids(answer) -> list[int]:
    try:
        ids = answer["tokens"]
        return [int(i) for i in ids]
    except (KeyError, TypeError, ValueError):
        raise ServerError("the model server's /tokenize answer has no token ids") from None


def _text(answer) -> str:
    if not isinstance(answer, dict) or not isinstance(answer.get("prompt"), str):
        raise ServerError("the model server's /detokenize answer has no text")
    return answer["prompt"]


def _pick_model(models, wanted: str | None, url: str) -> dict:
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise ServerError(f"{url}/models is not an OpenAI model list")
    ids = [e["id"] for e in entries]
    if wanted is not None:
        for e in entries:
            if wanted in (e["id"], e.get("root")):
                return e
        from inference.errors import ModelNotServed
        raise ModelNotServed(f"the model server at {url} does not serve {wanted!r}; it serves "
                             f"{', '.join(map(repr, ids)) or 'nothing'}")
    if len(entries) != 1:
        raise InputError(f"the model server at {url} serves {len(entries)} models "
                         f"({', '.join(map(repr, ids))}); choose one with --engine-model NAME")
    return entries[0]


def _read_config(given: str | None, served_root: str | None):
    """(cfg, where it was read, its dtype, sampling defaults) from a config.json or a model
    directory: the one given, else the path the server loaded the model from when this machine
    has it. A config that is given but unreadable is an error; a served path that is not here is
    no config."""
    from inference.loading.load import generation_defaults

    path = Path(given).expanduser() if given else None
    if path is None and served_root and Path(served_root).is_dir():
        path = Path(served_root)
    if path is None:
        return None, None, None, {}
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file():
        if given:
            raise ModelError(f"--engine-config {given}: no config.json there")
        return None, None, None, {}
    cfg = ModelConfig.from_json(config)
    import json
    data = json.loads(config.read_text(encoding="utf-8"))
    dtype = data.get("torch_dtype") or data.get("dtype")
    gen = generation_defaults(config.parent)
    return cfg, str(config), dtype if isinstance(dtype, str) else None, gen


def probe_logprobs_mode(http: ServerHTTP, model: str) -> str:
    """Which distribution the server's log-probabilities are: one greedy-free request for one
    token with top-k 1. With processed log-probabilities only that token is left (log p = 0,
    the rest -inf, which vLLM writes as -9999); raw ones are the model's distribution (log p < 0
    for both). Logits instead of log-probabilities (raw_logits, processed_logits) are refused."""
    body = {"model": model, "prompt": "The", "max_tokens": 1, "temperature": 1.0, "top_k": 1,
            "seed": 0, "logprobs": 2, "return_tokens_as_token_ids": True}
    answer = http.post_json("/completions", body)
    try:
        top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
        values = sorted((float(v) for v in top.values()), reverse=True)
    except (KeyError, IndexError, TypeError, ValueError):
        raise ServerError("the model server returned no log-probabilities; Token Lab needs an "
                          "OpenAI completions API with logprobs (vLLM)") from None
    if len(values) < 2:
        raise ServerError("the model server returned fewer log-probabilities than asked for")
    v1, v2 = values[:2]
    restart = ("; restart it with --logprobs-mode raw_logprobs (vLLM's default) or "
               "processed_logprobs, or say which with --engine-logprobs")
    if v2 <= -9000 or math.isinf(v2):  # top-k 1 removed the rest: processed numbers
        if abs(v1) < 1e-4:
            return "processed"
        raise ServerError(f"the model server returns processed logits, not log-probabilities{restart}")
    if v1 > 1e-4 or math.exp(v1) + math.exp(v2) > 1 + 1e-3:
        raise ServerError(f"the model server returns raw logits, not log-probabilities{restart}")
    return "raw"
