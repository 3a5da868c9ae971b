"""Beam search, step by step, as transformers' `generate(num_beams=W, do_sample=False)` does it
(its vectorized beam search, early_stopping=False): the same candidates, the same finished
beams, the same scores. The scheduler owns the forward passes; this module only chooses.

Each step takes the log-softmax of every live beam's logits (the model's own distribution: no
sampling stage applies), adds each beam's cumulative log-probability, and keeps the best
(1 + end-of-sequence ids) x W continuations of all beams together. Of those, the best W that
do not end (end-of-sequence, or the token cap) go on; one that ends among the first W is a
finished candidate, scored sum / length^length_penalty (length: the tokens generated, the end
token included), and joins the W best finished beams if it beats the worst. The search ends
when no live beam can beat the worst finished one (transformers' heuristic: the best live sum
over the current length^length_penalty), or at the token cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inference.errors import InputError, shown
from inference.events import BeamDoneEvent, BeamStepEvent

MAX_BEAMS = 8
_NEG = -1.0e9  # transformers' "impossible" score, kept so that the comparisons are its own
# A search that ended without a finished beam: every one that ended scored below _NEG (a length
# penalty of -5 multiplies a log-probability by length^5) and was dropped, as transformers drops it.
UNSCORED = "unscored"


def unscored_message(length_penalty: float) -> str:
    """Why a search ended with no beam, in one line (the page's, the API's and the CLI's)."""
    return (f"the beam search finished no beam: with length penalty {length_penalty:g} every beam that ended "
            f"scored below -1e9 (its log-probability / length^{length_penalty:g}), transformers' score of an "
            "impossible beam; use a length penalty nearer 0")


@dataclass
class Beam:
    """A live hypothesis: its generated tokens, its cumulative log-probability and its KV table."""
    tokens: list[int]
    logprob: float
    table: object = None  # the scheduler's BlockTable: the prompt and every token but the last

    @property
    def last(self) -> int:
        return self.tokens[-1]


@dataclass
class Hypothesis:
    """One continuation a step considered: beam `parent` (its index among the step's live beams)
    followed by `token_id`. status: "kept" (live at the next step as beam `beam`), "finished"
    (it ended and joined the best finished beams) or "pruned"."""
    parent: int
    token_id: int
    logprob: float  # of the token, in the model's distribution after the parent's tokens
    cumulative: float  # the sequence's log-probability so far
    status: str
    beam: int | None = None
    score: float | None = None  # finished: cumulative / length^length_penalty


@dataclass
class Finished:
    tokens: list[int]
    logprob: float  # the sequence's log-probability
    score: float  # logprob / len(tokens)^length_penalty
    eos: bool = False  # it ended with an end-of-sequence token (else at the token cap)


@dataclass
class BeamSearch:
    width: int
    length_penalty: float
    eos_ids: frozenset
    max_new: int
    live: list[Beam] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)  # the best `width`, best first
    improvable: bool = True  # transformers' is_early_stop_heuristic_unsatisfied
    steps: int = 0
    done: bool = False
    ended: str = ""  # "length" (the token cap) or "eos" (no live beam can beat the finished ones)

    @property
    def keep(self) -> int:
        """Continuations kept per step: enough that `width` go on even if the best all end."""
        return max(2, 1 + len(self.eos_ids)) * self.width

    def step(self, logits: torch.Tensor) -> list[tuple[Hypothesis, int]]:
        """One step from the live beams' logits (rows in the order of `live`; one row, the
        prompt's, at step 0). Returns every continuation considered, best first, each with the
        index of its parent; the caller makes the new live beams (`live` is replaced with them,
        their tables None: the caller forks the parents' tables)."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (n, vocab)
        running = torch.tensor([b.logprob for b in self.live] if self.live else [0.0],
                               dtype=torch.float32, device=logits.device)
        vocab = log_probs.shape[-1]
        total = (log_probs + running[:, None]).reshape(-1)  # (n * vocab,)
        top_scores, top_index = torch.topk(total, k=min(self.keep, total.numel()))
        top_scores, top_index = top_scores.cpu(), top_index.cpu()
        parents, tokens = (top_index // vocab).tolist(), (top_index % vocab).tolist()
        token_lp = log_probs.reshape(-1)[top_index.to(logits.device)].cpu().tolist()
        length = self.steps + 1
        at_cap = length >= self.max_new
        hits = torch.tensor([at_cap or t in self.eos_ids for t in tokens])
        # The live beams of the next step: the best `width` that do not end.
        going = top_scores + hits.float() * _NEG
        next_index = torch.topk(going, k=min(self.width, going.numel())).indices.tolist()
        # Finished candidates: those that end among the first `width`, length-penalised.
        first = torch.zeros(len(tokens), dtype=torch.bool)
        first[:self.width] = True
        ended = hits & first
        cand = top_scores / (length ** self.length_penalty)
        cand = cand + (0.0 if self.improvable else _NEG) + (~ended).float() * _NEG
        old = [f.score for f in self.finished] + [_NEG] * (self.width - len(self.finished))
        merged = torch.cat([torch.tensor(old, dtype=torch.float32), cand])
        best = torch.topk(merged, k=self.width).indices.tolist()
        base = len(self.finished)
        prefix = [b.tokens for b in self.live] if self.live else [[]]
        hyps = [Hypothesis(p, t, lp, float(s), "pruned") for p, t, lp, s in zip(parents, tokens, token_lp, top_scores.tolist())]
        finished = []
        for i in best:
            if i < self.width:
                if i < base:
                    finished.append(self.finished[i])
            elif merged[i] > _NEG / 2:
                h = hyps[i - self.width]
                h.status, h.score = "finished", float(merged[i])
                finished.append(Finished(prefix[h.parent] + [h.token_id], h.cumulative, h.score,
                                         h.token_id in self.eos_ids))
        self.finished = finished
        live = []
        for i in next_index:
            if bool(hits[i]):
                continue
            h = hyps[i]
            h.status, h.beam = "kept", len(live)
            live.append(Beam(prefix[h.parent] + [h.token_id], float(going[i])))
        self.live = live
        self.steps = length
        # transformers' heuristic, on the scores it has: can the best live beam beat the worst finished?
        if live and self.improvable:
            best_possible = live[0].logprob / (length ** self.length_penalty)
            worst = min(f.score for f in finished) if len(finished) == self.width else _NEG
            self.improvable = best_possible > worst
        if at_cap or not live or not self.improvable or bool(hits.all()):
            self.done, self.ended = True, "length" if at_cap else "eos"
            if not self.finished:  # nothing to give: said, never an empty answer
                self.ended = UNSCORED
        return [(h, h.parent) for h in hyps]

    # ---------------------------------------------------------------- the run's events
    def step_event(self, hyps, pieces: list[str], ms: float, kv_blocks: int, unshared: int, copied: int,
                   pool) -> BeamStepEvent:
        return BeamStepEvent(self.steps - 1, hyps, pieces, ms, kv_blocks, unshared, copied, pool)

    def done_event(self, reason: str, prompt_tokens: int, tokenizer, max_new: int, capped: bool) -> BeamDoneEvent:
        texts = [tokenizer.decode([t for t in f.tokens if t not in self.eos_ids]) for f in self.finished]
        return BeamDoneEvent(reason, list(self.finished), texts, prompt_tokens, self.steps, self.width,
                             self.length_penalty, max_new, capped)


def check_beams(params, given=()) -> None:
    """A beam search's settings: the model's own distribution ranks the beams, so a sampling
    stage (but temperature 0, which asks for no draw), stop strings, a constraint or given ids
    cannot apply; InputError naming the first that is set."""
    if params.num_beams == 1:
        return
    moved = [n for n in params.changed if not (n == "temperature" and params.greedy)]
    if moved:
        raise InputError(f"beam search ranks beams by the model's own log-probabilities: {moved[0]} cannot "
                         f"apply (set it to its neutral value, or use 1 beam)", field=moved[0])
    if params.stop:
        raise InputError("beam search does not take stop strings yet", field="stop")
    if given:
        raise InputError("beam search does not continue after given ids yet", field="num_beams")


def check_width(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BEAMS:
        raise InputError(f"num_beams must be a whole number from 1 to {MAX_BEAMS}, got {shown(n)}", field="num_beams")
    return n
