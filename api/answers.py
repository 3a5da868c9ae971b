"""The engine's events written as OpenAI's objects: completions, chat completions, their
streamed chunks, and the log-probabilities in each endpoint's shape (with vLLM's extensions:
token ids, stop_reason, prompt_logprobs).

The log-probabilities are the model's own distribution (temperature 1, nothing filtered: the
numbers the page's bars show as "raw", vLLM's default raw_logprobs), or with
logprobs_distribution "final" the distribution sampled from. Candidates are the most likely
tokens in the model's own distribution, the chosen one always listed. A probability of 0 (a
token the settings removed) is written -9999.0, as vLLM writes it: JSON has no -infinity.
"""

from __future__ import annotations

import math
import time
import uuid

from api.params import Ask
from inference.events import DoneEvent, PromptToken, StepEvent

NO_PROBABILITY = -9999.0  # log 0, as vLLM writes it


def logprob(p: float | None) -> float | None:
    if p is None or math.isnan(p):
        return None
    return math.log(p) if p > 0 else NO_PROBABILITY


def finish_reason(done: DoneEvent) -> str:
    """The engine's reason in OpenAI's words: eos and a stop string are "stop", the token cap
    and the end of the context "length"; a run the stopping server cancelled "abort" (vLLM's)."""
    return {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}.get(done.reason, "abort")


class Writer:
    """One answer's objects: its id and time, the model's name and how tokens are named."""

    def __init__(self, model: str, tokenizer, ask: Ask, kind: str):
        self.model, self.tok, self.ask, self.kind = model, tokenizer, ask, kind
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def name(self, token_id: int) -> str:
        """A token as the answer names it: its text (the page's piece), or vLLM's token_id:N."""
        return f"token_id:{token_id}" if self.ask.ids_as_tokens else self.tok.piece(token_id)

    def envelope(self, choices: list, chunk: bool = False, usage: dict | None = None) -> dict:
        obj = ("chat.completion" if self.kind == "chat" else "text_completion") + (".chunk" if chunk and self.kind == "chat" else "")
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    # ------------------------------------------------------------ one step's numbers

    def _lp(self, c) -> float | None:
        return logprob(c.prob if self.ask.final else c.raw_prob)

    def _step_top(self, ev: StepEvent) -> list:
        """The step's candidates asked for, most likely first, then the chosen one if not among them."""
        top = ev.top[:self.ask.logprobs or 0]
        if all(c.id != ev.token_id for c in top):
            top += [c for c in ev.top if c.id == ev.token_id]
        return top

    def step_completion_logprobs(self, ev: StepEvent) -> tuple[str, float | None, dict]:
        top = self._step_top(ev)
        return self.name(ev.token_id), self._lp(ev), {self.name(c.id): self._lp(c) for c in top}

    def step_chat_logprobs(self, ev: StepEvent) -> dict:
        top = [c for c in ev.top[:self.ask.logprobs or 0]]
        return {"token": self.name(ev.token_id), "logprob": self._lp(ev), "bytes": None,
                "top_logprobs": [{"token": self.name(c.id), "logprob": self._lp(c), "bytes": None} for c in top]}

    # ------------------------------------------------------------ completions

    def echo_logprobs(self, ids: list[int], scored: list[PromptToken], text: str) -> dict:
        """The prompt's tokens in a completion's logprobs: the first has none (nothing before it)."""
        n = self.ask.logprobs or 0
        tokens = [self.name(i) for i in ids]
        tops = [None] + [{**{self.name(i): lp for i, lp in t.top[:n]}, self.name(t.token_id): t.logprob}
                         for t in scored]
        pieces = [self.tok.piece(i) for i in ids]
        offsets = _offsets(pieces) if "".join(pieces) == text else [None] * len(ids)
        return {"tokens": tokens, "token_logprobs": [None] + [t.logprob for t in scored],
                "top_logprobs": tops, "text_offset": offsets}

    def steps_logprobs(self, steps: list[StepEvent], start: int) -> dict:
        """Generated tokens in a completion's logprobs; text offsets from `start` characters."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        at = start
        for ev in steps:
            token, lp, top = self.step_completion_logprobs(ev)
            out["tokens"].append(token)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(top)
            out["text_offset"].append(at)
            at += len(ev.text)
        return out

    def prompt_logprobs(self, ids: list[int], scored: list[PromptToken]) -> list:
        """vLLM's prompt_logprobs: per prompt position, None first, then {id: {logprob, rank,
        decoded_token}} for the prompt's token and the top candidates there."""
        n = self.ask.prompt_logprobs or 0
        out: list = [None]
        for t in scored:
            ranks = {i: (r + 1, lp) for r, (i, lp) in enumerate(t.top[:n])}
            ranks[t.token_id] = (t.rank, t.logprob)
            out.append({str(i): {"logprob": lp, "rank": r, "decoded_token": self.tok.piece(i)}
                        for i, (r, lp) in ranks.items()})
        return out

    def completion_choice(self, index: int, steps: list[StepEvent], done: DoneEvent | None,
                          prompt: tuple | None) -> dict:
        """One whole choice. prompt: (ids, scored, text) when echoed or its log-probabilities asked."""
        echo_text = prompt[2] if prompt is not None and self.ask.echo else ""
        text = echo_text + (done.text if done is not None else "")
        choice = {"index": index, "text": text, "logprobs": None,
                  "finish_reason": finish_reason(done) if done is not None else "length",
                  "stop_reason": done.stop_string if done is not None else None}
        if self.ask.logprobs is not None:
            lps = self.steps_logprobs(steps, len(echo_text))
            if self.ask.echo:
                first = self.echo_logprobs(*prompt)
                lps = {k: first[k] + lps[k] for k in lps}
            choice["logprobs"] = lps
        self._extras(choice, [ev.token_id for ev in steps], prompt)
        return choice

    def _extras(self, choice: dict, new_ids: list[int], prompt: tuple | None) -> None:
        if self.ask.token_ids:
            choice["token_ids"] = new_ids
            if prompt is not None:
                choice["prompt_token_ids"] = list(prompt[0])
        if self.ask.prompt_logprobs is not None and prompt is not None:
            choice["prompt_logprobs"] = self.prompt_logprobs(prompt[0], prompt[1])

    def says_nothing(self, ev: StepEvent) -> bool:
        """A step whose chunk would carry nothing: no text (an end-of-sequence token, text held
        back while it may begin a stop string), and neither log-probabilities nor token ids
        asked for. It is not sent: OpenAI's streams have no empty deltas."""
        return ev.text == "" and self.ask.logprobs is None and not self.ask.token_ids

    def completion_step_chunk(self, index: int, ev: StepEvent) -> dict:
        choice = {"index": index, "text": ev.text, "logprobs": None, "finish_reason": None, "stop_reason": None}
        if self.ask.logprobs is not None:
            choice["logprobs"] = self.steps_logprobs([ev], 0)
            choice["logprobs"]["text_offset"] = None  # offsets are of a whole text
        if self.ask.token_ids:
            choice["token_ids"] = [ev.token_id]
        return self.envelope([choice], chunk=True)

    def completion_prompt_chunk(self, index: int, prompt: tuple) -> dict:
        """A streamed echo: the prompt first, as one chunk."""
        choice = {"index": index, "text": prompt[2] if self.ask.echo else "", "logprobs": None,
                  "finish_reason": None, "stop_reason": None}
        if self.ask.echo and self.ask.logprobs is not None:
            choice["logprobs"] = self.echo_logprobs(*prompt)
        self._extras(choice, [], prompt)
        return self.envelope([choice], chunk=True)

    def completion_done_chunk(self, index: int, done: DoneEvent) -> dict:
        """The text held back until the end (if any), and why the choice ended."""
        choice = {"index": index, "text": done.tail, "logprobs": None,
                  "finish_reason": finish_reason(done), "stop_reason": done.stop_string}
        if self.ask.token_ids:
            choice["token_ids"] = []
        return self.envelope([choice], chunk=True)

    # ------------------------------------------------------------ chat completions

    def chat_choice(self, index: int, steps: list[StepEvent], done: DoneEvent) -> dict:
        choice = {"index": index, "message": {"role": "assistant", "content": done.text},
                  "logprobs": None, "finish_reason": finish_reason(done), "stop_reason": done.stop_string}
        if self.ask.logprobs is not None:
            choice["logprobs"] = {"content": [self.step_chat_logprobs(ev) for ev in steps]}
        if self.ask.token_ids:
            choice["token_ids"] = [ev.token_id for ev in steps]
        return choice

    def beam_choice(self, index: int, beam, text: str) -> dict:
        """One finished beam of a beam search (decoding.beams.Finished) as a choice: "stop" where
        it ended with an end-of-sequence token, else "length"."""
        choice = {"index": index, "logprobs": None, "finish_reason": "stop" if beam.eos else "length",
                  "stop_reason": None}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.ask.token_ids:
            choice["token_ids"] = list(beam.tokens)
        return choice

    def chat_role_chunk(self, index: int) -> dict:
        return self.envelope([{"index": index, "delta": {"role": "assistant", "content": ""},
                               "logprobs": None, "finish_reason": None}], chunk=True)

    def chat_step_chunk(self, index: int, ev: StepEvent) -> dict:
        choice = {"index": index, "delta": {"content": ev.text}, "logprobs": None, "finish_reason": None}
        if self.ask.logprobs is not None:
            choice["logprobs"] = {"content": [self.step_chat_logprobs(ev)]}
        if self.ask.token_ids:
            choice["token_ids"] = [ev.token_id]
        return self.envelope([choice], chunk=True)

    def chat_done_chunk(self, index: int, done: DoneEvent) -> dict:
        delta = {"content": done.tail} if done.tail else {}
        return self.envelope([{"index": index, "delta": delta, "logprobs": None,
                               "finish_reason": finish_reason(done), "stop_reason": done.stop_string}],
                             chunk=True)

    def usage_chunk(self, usage: dict) -> dict:
        return self.envelope([], chunk=True, usage=usage)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _offsets(pieces: list[str]) -> list[int]:
    out, at = [], 0
    for p in pieces:
        out.append(at)
        at += len(p)
    return out
