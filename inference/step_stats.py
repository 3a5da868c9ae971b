"""Sampling one step and what the step reports: the chosen token, its probability in the raw and
the final distribution, the top candidates, the raw entropy, the chosen token's rank, and the
kept logits for replay. All of it leaves the device in one transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .events import Candidate
from .replay import KEEP, StepLogits
from .sampling import SamplingParams, final_logits, sample


@dataclass
class StepInfo:
    token_id: int
    prob: float  # in the final distribution, the one sampled from
    raw_prob: float  # in the model's own distribution (temperature 1, nothing filtered)
    top: list[tuple[int, float, float]]  # (id, final p, raw p), most likely first; the chosen one always in
    entropy: float  # of the raw distribution, nats
    rank: int  # of the chosen token in the raw distribution, 1 = most likely
    logits: StepLogits | None  # kept for replay


class _Packed:
    """Named float64 segments concatenated for one device-to-host copy, read back by name."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []
        self.slices: dict[str, slice] = {}
        self._n = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        t = t.to(torch.float64).reshape(-1)
        self.parts.append(t)
        self.slices[name] = slice(self._n, self._n + t.numel())
        self._n += t.numel()

    def to_host(self) -> dict[str, torch.Tensor]:
        flat = torch.cat(self.parts).cpu()
        return {name: flat[s] for name, s in self.slices.items()}


def pick(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None,
         generator: torch.Generator, top_n: int) -> tuple[torch.Tensor, StepInfo]:
    """Sample from logits (vocab,) and gather what the step reports. Returns the next token as a
    (1, 1) tensor on the device, and the step's numbers. One host sync, and a second only when
    the token was sampled from outside the kept top KEEP (to count its rank).

    top_n = 0 skips the instrumentation (the benchmark's baseline): only the token is known.
    """
    final = final_logits(logits, params, seen).softmax(dim=-1)
    next_id = sample(final.unsqueeze(0), generator)[0]  # (1,)
    if top_n == 0:
        nan = float("nan")
        return next_id.view(1, 1), StepInfo(int(next_id.item()), nan, nan, [], nan, 0, None)

    # From e = exp(logits - max): Z = sum(e) gives the log-sum-exp, the sum of e outside the kept
    # top K the mass of the rest (summed on its own: Z minus the top's sum would cancel a tiny
    # tail away), dot(e, logits) / Z the mean logit, hence the entropy log Z - E[logit].
    vocab = logits.shape[-1]
    k = min(KEEP, vocab)
    top_n = min(top_n, k)
    top_logits, top_ids = logits.topk(k)  # sorted: top_logits[0] is the max
    e = (logits - top_logits[0]).exp()
    f = torch.float64
    packed = _Packed()
    packed.add("token", next_id)
    packed.add("final_chosen", final[next_id])
    packed.add("e_chosen", e[next_id])
    packed.add("logit_chosen", logits[next_id])
    packed.add("z", e.sum(dtype=f))
    packed.add("z_rest", e.index_fill(0, top_ids, 0).sum(dtype=f))
    packed.add("z_mean", torch.dot(e, logits))
    packed.add("kept_logits", top_logits)
    packed.add("kept_ids", top_ids)
    packed.add("final_top", final[top_ids[:top_n]])
    host = packed.to_host()

    token_id = int(host["token"])
    z, m = float(host["z"]), float(host["kept_logits"][0])
    lse = m + math.log(z)
    z_rest = float(host["z_rest"])
    rest = m + math.log(z_rest) if z_rest > 0 else -math.inf
    entropy = lse - float(host["z_mean"]) / z
    kept_logits, kept_ids = host["kept_logits"].float(), host["kept_ids"].to(torch.int32)
    chosen_logit = float(host["logit_chosen"])
    if chosen_logit >= kept_logits[-1].item():  # every larger logit is among the kept ones
        rank = int((kept_logits > chosen_logit).sum()) + 1
    else:  # sampled from the tail (a high temperature, no filter): count on the device
        rank = int((logits > logits[next_id]).sum()) + 1
    prob, raw_prob = float(host["final_chosen"]), float(host["e_chosen"]) / z
    top = [(i, p, math.exp(v - lse)) for i, p, v in zip(
        kept_ids[:top_n].tolist(), host["final_top"].tolist(), host["kept_logits"][:top_n].tolist())]
    if token_id not in {i for i, _, _ in top}:  # the chosen token is always listed
        top.append((token_id, prob, raw_prob))
    stored = StepLogits(kept_ids, kept_logits, rest, vocab)
    return next_id.view(1, 1), StepInfo(token_id, prob, raw_prob, top, entropy, rank, stored)


def candidates(info: StepInfo, piece) -> list[Candidate]:
    """The step's candidates as events carry them; piece(id) spells a token."""
    return [Candidate(i, piece(i), p, r) for i, p, r in info.top]
