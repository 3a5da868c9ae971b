"""Sampling one step, and what the step reports: the chosen token, its probability in the raw
and the final distribution, the top candidates, the raw entropy and the chosen token's rank.
All of it is computed on the device and leaves it in one transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference.errors import InputError
from inference.events import Candidate
from inference.model import kernels
from inference.sampling.params import SamplingParams
from inference.sampling.settings import order
from inference.sampling.stages import NO_DISTRIBUTION, final_logits, final_logits_removing, greedy_logits, sample
from inference.sampling.state import RunState


@dataclass
class StepInfo:
    token_id: int
    prob: float  # in the final distribution, the one sampled from
    raw_prob: float  # in the model's own distribution (temperature 1, nothing filtered)
    top: list[tuple[int, float, float]]  # (id, final p, raw p), most likely first; the chosen one always in
    entropy: float  # of the raw distribution, nats
    rank: int  # of the chosen token in the raw distribution, 1 = most likely
    masked_mass: float = 0.0  # raw probability mass the run's constraint forbade (0: no constraint)
    forbidden: frozenset = frozenset()  # the candidates the constraint forbade
    nothing_left: bool = False  # the stages and the constraint together kept no token: no draw
    # The candidates a stage removed (final p 0), each with that stage's setting name; greedy's
    # are "temperature" (temperature 0 keeps one token).
    removed_by: dict = None
    # The final probability of the tokens not in `top`, summed in float64 from the distribution
    # sampled from: exactly 0 where the stages removed every other token.
    unlisted_prob: float | None = None

    def __post_init__(self):
        self.removed_by = self.removed_by or {}


class _Packed:
    """Named segments for one device-to-host copy (concatenated as float64), read back by name.
    On the CPU they are there already: no copy."""

    def __init__(self):
        self.parts: dict[str, torch.Tensor] = {}

    def add(self, name: str, t: torch.Tensor) -> None:
        self.parts[name] = t

    def to_host(self, rows: int) -> dict[str, torch.Tensor]:
        """Each segment as (rows, its width)."""
        if all(t.device.type == "cpu" for t in self.parts.values()):
            return {name: t.reshape(rows, -1) for name, t in self.parts.items()}
        flat = torch.cat([t.to(torch.float64).reshape(-1) for t in self.parts.values()]).cpu()  # (total,)
        out, n = {}, 0
        for name, t in self.parts.items():
            out[name] = flat[n:n + t.numel()].view(rows, -1)
            n += t.numel()
        return out


@dataclass
class RowSampling:
    """How one row of a step's logits is sampled: its run's settings, state and generator."""
    params: SamplingParams
    state: RunState | None  # what the run's stages read (None: no context known)
    generator: torch.Generator
    top_n: int  # candidates reported; 0 skips the instrumentation (the benchmark's baseline)
    forced: int | None = None  # the token this step makes (a run of given tokens: a beam opened as a run)


def pick(logits: torch.Tensor, params: SamplingParams, state: RunState | None,
         generator: torch.Generator, top_n: int) -> tuple[torch.Tensor, StepInfo]:
    """Sample from logits (vocab,) and gather what the step reports. Returns the next token as a
    (1, 1) tensor on the device, and the step's numbers, with one host sync."""
    info = pick_rows(logits.unsqueeze(0), [RowSampling(params, state, generator, top_n)])[0]
    return torch.tensor([[info.token_id]], device=logits.device), info


def pick_rows(logits: torch.Tensor, rows: list[RowSampling]) -> list[StepInfo]:
    """Sample each row of logits (R, vocab) with its own settings and generator, and gather
    what each step reports: the statistics of all rows at once, in one host transfer."""
    if not rows:  # a step of prompt chunks only
        return []
    top_n = min(max(row.top_n for row in rows), logits.shape[-1])
    # The largest logits of every row first (one pass on a CPU; None elsewhere or with a NaN): a
    # greedy row no stage changed takes the first of them, argmax's choice, without a pass of its own.
    top = kernels.top_k(logits, max(top_n, 1))  # (values, ids), each (R, max(top_n, 1))
    greedy = [i for i, row in enumerate(rows) if row.params.greedy]
    next_id = torch.empty(len(rows), dtype=torch.long, device=logits.device)  # (R,)
    if greedy:
        at = torch.tensor(greedy, device=logits.device)
        raw = [logits[i] for i in greedy]
        penalized = [greedy_logits(x, rows[i].params, rows[i].state) for x, i in zip(raw, greedy)]
        if top is not None and all(p is x for p, x in zip(penalized, raw)):
            next_id[at] = top[1][at, 0]
        else:  # their argmaxes together, in one pass; a greedy row's one-hot is never made, nor a draw
            next_id[at] = torch.stack(penalized).argmax(dim=-1)  # (greedy rows, vocab) -> ids
    finals = {}  # the distributions of the rows that draw, by row
    # Rows whose stages all left the logits as they were: their final distribution is the raw
    # one, and reports the raw numbers (a float32 softmax differs from them in the last digit).
    unchanged = torch.zeros(len(rows), dtype=torch.bool)  # (R,)
    if top_n:
        top = top if top is not None else logits.topk(top_n, dim=-1)  # (values, ids), each (R, top_n), sorted
    # Per candidate, the position in its run's stage order of the stage that removed it (-1: none).
    removed = torch.full((len(rows), top_n), -1, dtype=torch.long, device=logits.device)  # (R, top_n)
    for i, row in enumerate(rows):
        if not row.params.greedy:
            row_logits = logits[i]
            if top_n:
                shaped, removed[i] = final_logits_removing(row_logits, row.params, row.state, top[1][i, :top_n])
            else:
                shaped = final_logits(row_logits, row.params, row.state)
            unchanged[i] = shaped is row_logits
            finals[i] = shaped.softmax(dim=-1)
            next_id[i] = sample(finals[i].unsqueeze(0), row.generator)[0, 0]
    for i, row in enumerate(rows):  # a forced row's numbers are its distribution's; its token is given
        if row.forced is not None:
            next_id[i] = row.forced
    # A distribution that is not one (a stage's numbers overflowed float32: NaN) draws past the
    # vocabulary; the row is refused below, and the index kept in range until then.
    overflowed = next_id >= logits.shape[-1]  # (R,)
    constrained = [i for i, row in enumerate(rows) if row.state is not None and row.state.constraint is not None]
    if constrained:
        # A constraint can forbid every token the stages before it kept: an empty distribution
        # (its draw runs past the vocabulary), or greedy's argmax of -inf everywhere.
        empty = torch.zeros(len(rows), dtype=torch.bool, device=logits.device)  # (R,)
        for i in constrained:
            empty[i] = ~(finals[i].sum() > 0) if i in finals else ~torch.isfinite(penalized[greedy.index(i)].max())
        overflowed &= ~empty
    next_id.clamp_(max=logits.shape[-1] - 1)
    if top_n == 0:
        if bool(overflowed.any()):
            raise InputError(NO_DISTRIBUTION)
        nan = float("nan")
        # Mirostat's μ moves by the chosen token's final probability: read for its rows only.
        return [StepInfo(t, (float(finals[i][t]) if i in finals else 1.0) if row.params.mirostat_tau > 0 else nan,
                         nan, [], nan, 0, nan, nothing_left=bool(empty[i]) if constrained else False)
                for i, (t, row) in enumerate(zip(next_id.tolist(), rows))]

    # From e = exp(logits - max): Z = sum(e) gives the log-sum-exp, sum(e * logits) / Z the mean
    # logit, hence the entropy log Z - E[logit]; sums in float64, so a tail of 1e-13 counts.
    top_logits, top_ids = top[0][:, :top_n], top[1][:, :top_n]  # (R, top_n), sorted
    e = (logits - top_logits[:, :1]).exp()  # (R, vocab)
    chosen_logit = logits.gather(1, next_id[:, None])  # (R, 1)
    # Products in float32 (a relative error of ~1e-9 in the sum), summed in float64; multiplying
    # two float64 copies cost 3 ms a step for 8 rows. On a CPU one pass over each row.
    sums = kernels.row_sums(logits, e, next_id)
    if sums is None:
        sums = (e.sum(dim=-1, dtype=torch.float64), (e * logits).sum(dim=-1, dtype=torch.float64),
                (logits > chosen_logit).sum(dim=-1))
    packed = _Packed()
    # The final probabilities of the chosen token and the candidates: a greedy row's are its one-hot.
    final_chosen = torch.ones(len(rows), 1, dtype=logits.dtype, device=logits.device)  # (R, 1)
    final_top = (top_ids == next_id[:, None]).to(logits.dtype)  # (R, top_n)
    unlisted = torch.zeros(len(rows), 1, dtype=torch.float64, device=logits.device)  # (R, 1); greedy's: 0
    if finals:
        drawn = torch.tensor(list(finals), device=logits.device)
        final = torch.stack(list(finals.values()))  # (drawn rows, vocab)
        final_chosen[drawn] = final.gather(1, next_id[drawn, None])
        final_top[drawn] = final.gather(1, top_ids[drawn])
        # Every token but the candidates and the chosen one (listed too): one pass a drawn row.
        rest = final.scatter(1, top_ids[drawn], 0.0).scatter_(1, next_id[drawn, None], 0.0)  # (drawn rows, vocab)
        unlisted[drawn] = rest.sum(dim=-1, keepdim=True, dtype=torch.float64)
    packed.add("token", next_id)
    packed.add("final_chosen", final_chosen)
    packed.add("logit_chosen", chosen_logit)
    packed.add("z", sums[0])
    packed.add("z_mean", sums[1])
    packed.add("rank", sums[2] + 1)
    packed.add("top_logits", top_logits)
    packed.add("top_ids", top_ids)
    packed.add("final_top", final_top)
    packed.add("unchanged", unchanged.to(logits.device))
    packed.add("removed", removed)
    packed.add("unlisted", unlisted)
    if constrained:  # the raw mass of the forbidden tokens, and which candidates they are
        forbidden = torch.zeros_like(logits, dtype=torch.bool)  # (R, vocab)
        for i in constrained:
            forbidden[i] = ~rows[i].state.constraint.allowed.to(logits.device)
        packed.add("forbidden_z", e.masked_fill(~forbidden, 0).sum(dim=-1, dtype=torch.float64))
        packed.add("top_forbidden", forbidden.gather(1, top_ids))
        packed.add("empty", empty)
    packed.add("overflowed", overflowed)
    host = packed.to_host(len(rows))
    if bool(host["overflowed"].any()):  # which row's: the scheduler samples each alone
        raise InputError(NO_DISTRIBUTION)
    return [_info(host, r, row.top_n, row.params) for r, row in enumerate(rows)]


def _removed_by(host: dict[str, torch.Tensor], r: int, top_n: int, params: SamplingParams,
                token_id: int) -> dict[int, str]:
    """Which stage removed each candidate of row r: by its setting name."""
    ids = host["top_ids"][r, :top_n].tolist()
    if params.greedy:  # temperature 0 keeps the one token (a forbidden one is the constraint's)
        return {int(i): "temperature" for i in ids if int(i) != token_id}
    names = order(params.sampler_order)
    return {int(i): names[int(k)] for i, k in zip(ids, host["removed"][r, :top_n].tolist()) if k >= 0}


def _info(host: dict[str, torch.Tensor], r: int, top_n: int, params: SamplingParams) -> StepInfo:
    """Row r's numbers from the host copy, with its own number of candidates."""
    token_id = int(host["token"][r, 0])
    if top_n == 0:
        nan = float("nan")
        return StepInfo(token_id, nan, nan, [], nan, 0)
    z, m = float(host["z"][r, 0]), float(host["top_logits"][r, 0])
    lse = m + math.log(z)
    entropy = lse - float(host["z_mean"][r, 0]) / z
    # exp(logit - lse) for the chosen token and the candidates alike: one number for one thing.
    prob, raw_prob = float(host["final_chosen"][r, 0]), math.exp(float(host["logit_chosen"][r, 0]) - lse)
    top = [(int(i), p, math.exp(v - lse)) for i, p, v in zip(
        host["top_ids"][r, :top_n].tolist(), host["final_top"][r, :top_n].tolist(),
        host["top_logits"][r, :top_n].tolist())]
    if host["unchanged"][r, 0]:  # no stage moved the distribution: the final one is the raw one
        prob, top = raw_prob, [(i, raw, raw) for i, _, raw in top]
    if token_id not in {i for i, _, _ in top}:  # the chosen token is always listed
        top.append((token_id, prob, raw_prob))
    masked, forbidden, empty = 0.0, frozenset(), False
    if "forbidden_z" in host:
        masked = float(host["forbidden_z"][r, 0]) / z
        forbidden = frozenset(i for (i, _, _), f in zip(top, host["top_forbidden"][r, :top_n].tolist()) if f)
        empty = bool(host["empty"][r, 0])
    return StepInfo(token_id, prob, raw_prob, top, entropy, int(host["rank"][r, 0]), masked, forbidden, empty,
                    _removed_by(host, r, top_n, params, token_id), _unlisted(host, r, top_n, token_id))


def _unlisted(host: dict[str, torch.Tensor], r: int, top_n: int, token_id: int) -> float:
    """Row r's final probability outside its own top_n candidates and its token: the batch's
    sum, plus the candidates the batch gathered beyond this row's top_n."""
    beyond = zip(host["top_ids"][r, top_n:].tolist(), host["final_top"][r, top_n:].tolist())
    return float(host["unlisted"][r, 0]) + sum(p for i, p in beyond if int(i) != token_id)


def candidates(info: StepInfo, piece) -> list[Candidate]:
    """The step's candidates as events carry them; piece(id) spells a token."""
    return [Candidate(i, piece(i), p, r, i in info.forbidden, info.removed_by.get(i, ""))
            for i, p, r in info.top]
