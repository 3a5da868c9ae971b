"""What the page keeps about a run, per browser session, and what is computed from it."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference.loading.byte_pieces import hex_pieces, unfinished_tail
from inference.sampling.settings import how_made
from inference.events import DoneEvent, PrefillEvent, StepEvent, WaitEvent

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Opened:
    """A finished beam of a beam search, to be opened as a run: the next run of its tab makes
    these tokens (RunRequest.forced) after the same prompt, on the same model."""
    model: str
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    label: str  # "beam 1 of 3"


@dataclass(frozen=True)
class FromText:
    """A point of a scored text ("the probability of a text"), to be run from: the next run of
    its tab reads the text's ids before token `at` as its prompt (inference.request's
    prepare_from_text), on the model that scored them; with `candidate`, that token is put in
    token `at`'s place (given: the stages count it as generated) and the run continues after it."""
    model: str
    ids: tuple[int, ...]  # the text as scored (a BOS where the model adds one)
    at: int  # the token's place in ids
    candidate: int | None = None
    text: str = ""  # the text of the ids before `at`, as the scored text has it (the prompt's text)
    label: str = ""  # the token as the panel numbers it: "token 6 of the scored text"


@dataclass
class RunRecord:
    """Everything the page keeps about one run, per browser session."""
    model: str = ""  # the label of the model that made it (inference.serving.models)
    prompt_text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    done: DoneEvent | None = None
    seed: int | None = None
    params: object = None  # the SamplingParams the run used
    bias: dict = field(default_factory=dict)  # token id -> its logit bias in this run (text encoded)
    mode: str = "completion"
    user_message: str = ""  # the prompt as typed (in chat mode: the new user message)
    system: str = ""
    history: list = field(default_factory=list)  # the earlier chat turns this run continued
    max_steps: int = 0  # the most tokens it may make: max new tokens, capped by the context
    queued_at: float | None = None  # time.monotonic() at the click
    started_at: float | None = None  # when the engine took the run (None: still waiting)
    finished: bool = False  # after_run has drawn its end (charts, files, chat turn)
    error: str = ""  # why the run failed mid-way, one line (empty: it did not)
    controls: object = None  # the page's Controls the run was started with
    waiting: WaitEvent | None = None  # while the run is queued for KV blocks
    prefilled: int = 0  # prompt tokens read so far, while a long prompt is read a chunk a step
    started: float = field(default_factory=time.monotonic)  # when Generate was handled
    # The full logits of the last step replayed, (step, (vocab,) tensor): moving a replay
    # slider on the same step then costs no forward pass.
    _logits: tuple | None = field(default=None, repr=False, compare=False)
    kv_bytes_per_token: int | None = None  # the formula's, for a run whose engine does not measure it
    # A branch continues after these ids (generated before, by the run it branched from), as
    # token ids: the model read them after the prompt; given_text is their text.
    given: list[int] = field(default_factory=list)
    given_text: str = ""
    request: object = None  # the inference.request.RunRequest it runs (None: a record read back)
    opened: str = ""  # a beam opened as a run: what the page says of it (its tokens were given)
    owner: str | None = None  # the login that ran it (with --auth): only they may fetch its downloads

    @property
    def answer_text(self) -> str:
        """The whole text after the prompt: the given tokens' and the generated ones'."""
        return self.given_text + (self.done.text if self.done is not None else "".join(s.text for s in self.steps))

    @property
    def cut_off(self) -> str:
        """The bytes of a character the run's end cut off, as pieces ("<0xE5><0xA4>"; "" for
        none): the engine's text leaves them out (StreamDecoder.flush), the page says them."""
        if self.done is None or self.done.reason == "stop":  # (a stop string ends the text first)
            return ""
        steps = self.steps[:-1] if self.done.reason == "eos" else self.steps  # (its token is no text)
        return hex_pieces(unfinished_tail([s.piece for s in steps]))

    def add(self, ev) -> None:
        """Take one engine event."""
        if isinstance(ev, WaitEvent):
            self.waiting = ev
        elif isinstance(ev, PrefillEvent):
            self.prefilled, self.waiting = ev.done, None
        elif isinstance(ev, DoneEvent):
            self.done, self.waiting = ev, None
        else:
            self.steps.append(ev)
            self.waiting = None

    def seen_before(self, step: int) -> list[int]:
        """Ids the model read before `step`: the prompt, the given tokens and those generated."""
        return self.prompt_ids + self.given + [s.token_id for s in self.steps[:step]]

    def generated_before(self, step: int) -> list[int]:
        """The tokens the run's stages counted as generated at `step` (the given ones first)."""
        return self.given + [s.token_id for s in self.steps[:step]]

    # The last capture looked inside, ((step, layer), what compute returned): another head of
    # the same step and layer costs no forward pass.
    _capture: tuple | None = field(default=None, repr=False, compare=False)

    def logits_at(self, step: int, compute) -> "torch.Tensor":
        """The step's logits, from compute(context ids) unless this step's are kept already."""
        if self._logits is None or self._logits[0] != step:
            self._logits = (step, compute(self.seen_before(step)))
        return self._logits[1]

    def capture_at(self, step: int, layer: int, compute):
        """What compute(context ids) returns for this step and layer, kept for the next call."""
        if self._capture is None or self._capture[0] != (step, layer):
            self._capture = ((step, layer), compute(self.seen_before(step)))
        return self._capture[1]


def turn_messages(rec: RunRecord) -> list[dict]:
    """The chat turn a run made: its user message and the answer (empty for other runs)."""
    if rec.mode != "chat" or rec.done is None or not rec.user_message:
        return []
    return [{"role": "user", "content": rec.user_message}, {"role": "assistant", "content": rec.answer_text}]


def run_jsonl(rec: RunRecord) -> str:
    """The run's per-step data as the CLI's --jsonl writes it: one StepEvent per line, then the
    DoneEvent with how the run was made (a branch's or an edit's given ids among its settings,
    as the CLI's --prefix-ids) and the model that made it."""
    lines = [json.dumps(s.to_json(), ensure_ascii=False) for s in rec.steps]
    if rec.done is not None:
        made = {} if rec.params is None else how_made(rec.params, rec.given)
        cut = {"cut_off": rec.cut_off} if rec.cut_off else {}  # bytes of a character the end cut, not in text
        lines.append(json.dumps({**rec.done.to_json(), **made, **cut, "model": rec.model}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def _mean(values: list) -> float:
    """The mean, or NaN when there is none or any value is unknown (None)."""
    if not values or any(v is None for v in values):
        return float("nan")
    return sum(values) / len(values)


def run_summary(rec: RunRecord) -> dict:
    """Mean chosen-token probability, mean raw entropy, and the perplexity of the generated
    text under the model (from the raw probabilities of the chosen tokens). NaN where the engine
    does not know a step's number (in front of a server: None)."""
    steps = rec.steps
    if not steps:
        return {"tokens": 0, "mean_p": float("nan"), "mean_entropy": float("nan"), "perplexity": float("nan")}
    chosen = [s.prob if s.prob is not None else s.raw_prob for s in steps]
    logp = _mean([None if s.raw_prob is None else math.log(max(s.raw_prob, 1e-45)) for s in steps])
    return {"tokens": len(steps), "mean_p": _mean(chosen),
            "mean_entropy": _mean([s.entropy for s in steps]),
            "perplexity": math.exp(-logp) if logp == logp else float("nan")}


@dataclass(frozen=True)
class Divergence:
    """Where two runs part: the step of each that holds it (None: that run had ended before),
    and, when their texts were compared (tokenizers that differ), the first character where the
    texts differ (None: their token ids were compared)."""
    a: int | None
    b: int | None
    char: int | None = None


def divergence(a: RunRecord, b: RunRecord) -> Divergence | None:
    """The first step whose token ids differ, or where one run stopped (None: the same tokens)."""
    for i, (x, y) in enumerate(zip(a.steps, b.steps)):
        if x.token_id != y.token_id:
            return Divergence(i, i)
    at = min(len(a.steps), len(b.steps))
    if len(a.steps) == len(b.steps):
        return None
    return Divergence(at if at < len(a.steps) else None, at if at < len(b.steps) else None)


def _step_holding(rec: RunRecord, char: int) -> int | None:
    """The step by which the text had reached character `char` (text held back until the
    end, DoneEvent.tail: the last step); None when the text is shorter."""
    if char >= len(rec.answer_text) - len(rec.given_text) or not rec.steps:
        return None
    end = 0
    for i, s in enumerate(rec.steps):
        end += len(s.text)
        if end > char:
            return i
    return len(rec.steps) - 1


def text_divergence(a: RunRecord, b: RunRecord) -> Divergence | None:
    """Across two vocabularies (a token id is not the same text in both): the first character
    where the generated texts differ, and each run's step that holds it (None: the same text)."""
    ta, tb = (r.answer_text[len(r.given_text):] for r in (a, b))
    if ta == tb:
        return None
    char = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    return Divergence(_step_holding(a, char), _step_holding(b, char), char)
