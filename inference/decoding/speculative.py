"""Speculative decoding: a drafter proposes k tokens, the target model checks them all in one
forward pass, and the standard rejection rule keeps the text's distribution the target's own.

Each round feeds the target the last emitted token and the k proposals d_1..d_k: its rows give
p_1..p_{k+1}, the run's final distributions after each prefix (the stages applied to the
target's logits, as a plain run samples from). Proposal d_i is accepted with probability
min(1, p_i(d_i) / q_i(d_i)) (a coin u from the run's generator, accept when u < the ratio); at
the first rejection the token is drawn from the residual, (p_i - q_i)+ normalised, and the round
ends; if all k are accepted a last token is drawn from p_{k+1}. A deterministic drafter's q is
one-hot. Greedy decoding (p one-hot) accepts exactly the proposals equal to the target's argmax
and corrects with the argmax: the text is plain greedy decoding's, token for token.

Runs on the caller's thread, outside the scheduler, over a paged KV pool of its own through the
scheduler's step (Transformer.forward_paged): a round's k+1 rows are decode rows of one sequence
at consecutive positions, each attending to the positions before its own, so on a CPU the round
is the one-call decode step of up to KERNEL_ROWS rows (a plain step's weight reads, k+1 rows).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from inference.errors import InputError
from inference.events import Candidate
from inference.model.attention import PagedBatch
from inference.model.kv_cache import BLOCK_SIZE
from inference.sampling.stages import NO_DISTRIBUTION, final_probs, sample

# Stages whose distribution depends on the logits alone: p and q at a proposed position are then
# the ones a plain run would sample from there. (Penalties, DRY, XTC's coin, Mirostat's μ and a
# constraint read the run's state, which a proposal would have to advance and roll back.)
STATELESS_STAGES = frozenset({"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff",
                              "eta_cutoff", "top_n_sigma"})
MAX_DRAFT_TOKENS = 16


def check_speculative(params, k) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_TOKENS:
        raise InputError(f"--draft-tokens must be from 1 to {MAX_DRAFT_TOKENS}, got {k}", field="draft_tokens")
    moved = [n for n in params.changed if n not in STATELESS_STAGES]
    if moved:
        raise InputError(f"speculative decoding takes the stages that read only the logits "
                         f"({', '.join(sorted(STATELESS_STAGES))}): {moved[0]} cannot apply yet", field=moved[0])
    if params.num_beams > 1:
        raise InputError("speculative decoding and beam search together are not served", field="num_beams")
    if params.stop:
        raise InputError("speculative decoding does not take stop strings yet", field="stop")


def timed(events, step_type) -> tuple[list, float | None, object]:
    """A run's events read to the end: its steps (step_type), its decode rate (the tokens after
    the first over the time from the first to the end: a speculative round's tokens arrive
    together, so both kinds of run are timed alike) and its last event."""
    steps, first, last = [], None, None
    for ev in events:
        if isinstance(ev, step_type):
            steps.append(ev)
            if first is None:
                first = time.perf_counter()
        last = ev
    end = time.perf_counter()
    rate = (len(steps) - 1) / (end - first) if len(steps) > 1 and end > first else None
    return steps, rate, last


def residual(p: torch.Tensor, q: torch.Tensor | None, draft: int) -> torch.Tensor:
    """(p - q)+ normalised: what a rejected proposal's token is drawn from. q None: one-hot at
    the draft. Where nothing is left (p <= q everywhere: only in rounding) p itself."""
    if q is None:
        q = torch.zeros_like(p)
        q[draft] = 1.0
    r = (p.double() - q.double()).clamp_(min=0)
    total = r.sum()
    return (r / total) if total > 0 else p.double()


@dataclass
class Decision:
    """One emitted token of a round: a proposal accepted, a correction drawn after a rejection,
    or the round's last token drawn from the target (every proposal accepted, or none made)."""
    token: int
    row: int  # the target's row it was decided at (its position in the round)
    proposed: int | None = None  # the drafter's proposal at this position (None: none made)
    accepted: bool | None = None  # None: nothing was proposed here
    target_prob: float | None = None  # p(proposal)
    draft_prob: float | None = None  # q(proposal)
    coin: float | None = None  # u, accepted when u < min(1, p/q); None when greedy (no draw)


def verify(p_rows: torch.Tensor, drafts: list[tuple[int, torch.Tensor | None]], generator: torch.Generator,
           greedy: bool, rule: Callable = residual) -> list[Decision]:
    """The rejection rule over one round: p_rows (k+1, vocab) the target's distributions, drafts
    the k proposals with their q. The tokens emitted, in order (ends at the first rejection)."""
    out = []
    for i, (d, q) in enumerate(drafts):
        p = p_rows[i]
        pd, qd = float(p[d]), (1.0 if q is None else float(q[d]))
        if greedy:
            coin, accept = None, pd == 1.0
        else:
            coin = float(torch.rand((), generator=generator, dtype=torch.float64))
            accept = qd > 0 and coin < min(1.0, pd / qd)
        if accept:
            out.append(Decision(d, i, d, True, pd, qd, coin))
            continue
        r = rule(p, q, d)
        token = int(r.argmax()) if greedy else int(sample(r[None], generator)[0, 0])
        out.append(Decision(token, i, d, False, pd, qd, coin))
        return _drawn(out, p_rows.shape[-1])
    last = p_rows[len(drafts)]
    token = int(last.argmax()) if greedy else int(sample(last[None], generator)[0, 0])
    out.append(Decision(token, len(drafts)))
    return _drawn(out, p_rows.shape[-1])


def _drawn(decisions: list[Decision], vocab: int) -> list[Decision]:
    """The round's decisions, unless its last draw came from a distribution that was not one (a
    stage overflowed float32): that draw runs past the vocabulary."""
    if decisions[-1].token >= vocab:
        raise InputError(NO_DISTRIBUTION)
    return decisions


@dataclass
class SpecStepEvent:
    """One emitted token of a speculative run, with how it was decided."""
    step: int
    token_id: int
    piece: str
    text: str
    prob: float  # the target's final probability of this token here (the distribution a plain run samples)
    raw_prob: float  # the target's own (softmax of its logits)
    top: list[Candidate]
    round: int  # the round (one target pass) it came from
    proposed: int | None  # the drafter's proposal here (None: none)
    proposed_piece: str | None
    accepted: bool | None  # the proposal was accepted (None: none proposed)
    target_prob: float | None  # p(proposal)
    draft_prob: float | None  # q(proposal)
    coin: float | None  # u: accepted when u < min(1, p/q); None in greedy decoding
    round_ms: float  # the round's wall time: the drafter's proposals and the target's one pass

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["top"] = [c.__dict__ for c in self.top]
        return d


@dataclass
class SpecDoneEvent:
    reason: str  # "eos", "length", "context", "cancelled"
    text: str
    generated_tokens: int
    rounds: int  # target passes after the prompt's
    proposed: int
    accepted: int
    drafter: str
    draft_tokens: int
    seed: int
    decode_ms: float  # from the first round's start to the end
    prompt_tokens: int
    done: bool = True

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    def to_json(self) -> dict:
        return {**self.__dict__, "acceptance_rate": self.acceptance_rate,
                "tokens_per_target_pass": self.generated_tokens / self.rounds if self.rounds else None}


@dataclass
class Speculator:
    """One speculative run of a prepared request on an engine, with a drafter (drafters.py)."""
    engine: object
    drafter: object
    k: int
    rule: Callable = residual  # the residual rule (a test gives a wrong one)
    top_n: int = 5
    _state: dict = field(default_factory=dict)

    def run(self, request, cancel: threading.Event | None = None) -> Iterator[SpecStepEvent | SpecDoneEvent]:
        e, params = self.engine, request.params
        check_speculative(params, self.k)
        model, tok = e.model, e.tokenizer
        generator = torch.Generator(device=model.device)
        generator.manual_seed(request.seed)
        ids = list(request.ids)
        n_prompt = len(ids)
        target = PagedSequence(model, n_prompt + request.max_new + self.k + 1)
        stream = tok.stream()
        generated, parts = [], []
        rounds = proposed = accepted = 0
        reason = "length"
        with e._work(), torch.inference_mode():
            if n_prompt > 1:  # the prompt but its last token; each round feeds the last emitted one
                target.prefill(ids[:-1])
            start = time.perf_counter()
            while len(generated) < request.max_new:
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                t0 = time.perf_counter()
                k = min(self.k, request.max_new - len(generated) - 1)
                drafts = self.drafter.propose(ids, k, params, generator) if k > 0 else []
                pos = len(ids) - 1
                fed = [ids[-1]] + [d for d, _ in drafts]
                logits = target.rows(fed, pos)  # (k+1, vocab)
                p_rows = final_probs(logits, params, None)  # (k+1, vocab)
                decisions = verify(p_rows, drafts, generator, params.greedy, self.rule)
                rounds += 1
                proposed += len(drafts)
                accepted += sum(1 for d in decisions if d.accepted)
                ms = (time.perf_counter() - t0) * 1000
                raw = logits.float().softmax(-1)
                for d in decisions:
                    token = d.token
                    ids.append(token)
                    generated.append(token)
                    is_eos = token in e.eos_ids
                    text = "" if is_eos else stream.push(token)
                    parts.append(text)
                    p = p_rows[d.row]
                    top = torch.topk(p, min(self.top_n, p.numel()))
                    yield SpecStepEvent(
                        len(generated) - 1, token, tok.piece(token), text, float(p[token]), float(raw[d.row, token]),
                        [Candidate(int(i), tok.piece(int(i)), float(v), float(raw[d.row, int(i)]))
                         for v, i in zip(top.values, top.indices)],
                        rounds - 1, d.proposed, None if d.proposed is None else tok.piece(d.proposed), d.accepted,
                        d.target_prob, d.draft_prob, d.coin, ms)
                    if is_eos:
                        reason = "eos"
                        break
                if reason == "eos":
                    break
            else:
                reason = "context" if request.capped else "length"
            tail = stream.flush() if reason != "eos" else ""
        yield SpecDoneEvent(reason, "".join(parts) + tail, len(generated), rounds, proposed, accepted,
                            getattr(self.drafter, "name", "drafter"), self.k, request.seed,
                            (time.perf_counter() - start) * 1000 if rounds else 0.0, n_prompt)


class PagedSequence:
    """One sequence's KV cache as a paged pool of its own, read and written by the scheduler's
    step (Transformer.forward_paged): its blocks are 0, 1, 2, ... so a position's slot is the
    position itself."""

    def __init__(self, model, capacity: int):
        cfg, self.model = model.cfg, model
        n_blocks = -(-capacity // BLOCK_SIZE)
        shape = (cfg.n_layers, n_blocks * BLOCK_SIZE, cfg.n_kv_heads, cfg.head_dim)
        # Zeroed: attention reads whole blocks, the positions past a row's own masked out (a masked
        # weight of 0 times never-written memory, possibly NaN, would still be NaN).
        self.k = torch.zeros(shape, device=model.device, dtype=model.dtype)
        self.v = torch.zeros(shape, device=model.device, dtype=model.dtype)
        self.k_layers, self.v_layers = list(self.k.unbind(0)), list(self.v.unbind(0))
        self.blocks = torch.arange(n_blocks, device=model.device)  # (nb,)

    def prefill(self, ids: list[int]) -> None:
        """The positions 0..len(ids)-1 read as one prompt chunk."""
        dev, n = self.model.device, len(ids)
        at = torch.arange(n, device=dev)  # (n,): positions, and slots
        batch = PagedBatch(positions=at, write_slots=at, decode_rows=None, decode_blocks=None, decode_mask=None,
                           prefills=[(0, n, at, 0)], logit_rows=at[-1:])
        self.model.forward_paged(torch.tensor(ids, device=dev), batch, self.k_layers, self.v_layers)

    def rows(self, tokens: list[int], start: int) -> torch.Tensor:
        """tokens at positions start.. as decode rows, each seeing the positions up to its own
        (those written before, and this step's rows before it): float32 logits (rows, vocab)."""
        dev, n = self.model.device, len(tokens)
        at = torch.arange(start, start + n, device=dev)  # (n,): positions, and slots
        context = self.blocks.expand(n, -1).contiguous()  # (n, nb): every row reads the same blocks
        mask = torch.arange(context.shape[1] * BLOCK_SIZE, device=dev) <= at[:, None]  # (n, nb * BLOCK_SIZE)
        batch = PagedBatch(positions=at, write_slots=at, decode_rows=torch.arange(n, device=dev),
                           decode_blocks=context, decode_mask=mask[:, None, None, :], prefills=[],
                           logit_rows=torch.arange(n, device=dev))
        return self.model.forward_paged(torch.tensor(tokens, device=dev), batch, self.k_layers, self.v_layers)
