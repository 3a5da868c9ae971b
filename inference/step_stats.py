"""Sampling one step, and what the step reports: the chosen token, its probability in the raw
and the final distribution, the top candidates, the raw entropy and the chosen token's rank.
All of it is computed on the device and leaves it in one transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .events import Candidate
from .sampling import SamplingParams, final_logits, sample


@dataclass
class StepInfo:
    token_id: int
    prob: float  # in the final distribution, the one sampled from
    raw_prob: float  # in the model's own distribution (temperature 1, nothing filtered)
    top: list[tuple[int, float, float]]  # (id, final p, raw p), most likely first; the chosen one always in
    entropy: float  # of the raw distribution, nats
    rank: int  # of the chosen token in the raw distribution, 1 = most likely


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
    (1, 1) tensor on the device, and the step's numbers, with one host sync.

    top_n = 0 skips the instrumentation (the benchmark's baseline): only the token is known.
    """
    final = final_logits(logits, params, seen).softmax(dim=-1)
    if params.temperature == 0:  # one token left: no draw (which would cost a pass over the vocabulary)
        next_id = final.argmax().view(1)  # (1,)
    else:
        next_id = sample(final.unsqueeze(0), generator)[0]  # (1,)
    if top_n == 0:
        nan = float("nan")
        return next_id.view(1, 1), StepInfo(int(next_id.item()), nan, nan, [], nan, 0)

    # From e = exp(logits - max): Z = sum(e) gives the log-sum-exp, dot(e, logits) / Z the mean
    # logit, hence the entropy log Z - E[logit]; sums in float64, so a tail of 1e-13 counts.
    top_n = min(top_n, logits.shape[-1])
    top_logits, top_ids = logits.topk(top_n)  # sorted: top_logits[0] is the max
    e = (logits - top_logits[0]).exp()
    chosen_logit = logits[next_id]
    packed = _Packed()
    packed.add("token", next_id)
    packed.add("final_chosen", final[next_id])
    packed.add("logit_chosen", chosen_logit)
    packed.add("z", e.sum(dtype=torch.float64))
    packed.add("z_mean", torch.dot(e.double(), logits.double()))
    packed.add("rank", (logits > chosen_logit).sum() + 1)
    packed.add("top_logits", top_logits)
    packed.add("top_ids", top_ids)
    packed.add("final_top", final[top_ids])
    host = packed.to_host()

    token_id = int(host["token"])
    z, m = float(host["z"]), float(host["top_logits"][0])
    lse = m + math.log(z)
    entropy = lse - float(host["z_mean"]) / z
    # exp(logit - lse) for the chosen token and the candidates alike: one number for one thing.
    prob, raw_prob = float(host["final_chosen"]), math.exp(float(host["logit_chosen"]) - lse)
    top = [(int(i), p, math.exp(v - lse)) for i, p, v in zip(
        host["top_ids"].tolist(), host["final_top"].tolist(), host["top_logits"].tolist())]
    if token_id not in {i for i, _, _ in top}:  # the chosen token is always listed
        top.append((token_id, prob, raw_prob))
    return next_id.view(1, 1), StepInfo(token_id, prob, raw_prob, top, entropy, int(host["rank"]))


def candidates(info: StepInfo, piece) -> list[Candidate]:
    """The step's candidates as events carry them; piece(id) spells a token."""
    return [Candidate(i, piece(i), p, r) for i, p, r in info.top]
