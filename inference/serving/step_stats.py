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
from inference.sampling.constraint_cost import ConstraintCost, drawn_cost, greedy_cost
from inference.sampling.params import SamplingParams
from inference.sampling.settings import order
from inference.sampling import constrain
from inference.sampling.stages import NO_DISTRIBUTION, Candidates, final_candidates, greedy_logits, sample, stages
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
    emptied_by: str = ""  # nothing_left: the stage (setting name) that removed the last token the constraint allows
    # What the constraint cost at this step (constraint_cost.py; None: no constraint): KL(constrained
    # ‖ free) of the final distributions, the chosen token's free probability, and the free
    # distribution's top tokens it forbade as (id, free p, raw p).
    constraint_kl: float | None = None
    free_prob: float | None = None
    constraint_removed: list | None = None

    def __post_init__(self):
        self.removed_by = self.removed_by or {}


class _Packed:
    """Named segments for one device-to-host copy (concatenated as float64), read back by name as
    Python numbers (lists of the segment's shape). On the CPU they are there already: no copy."""

    def __init__(self):
        self.parts: dict[str, torch.Tensor] = {}

    def add(self, name: str, t: torch.Tensor) -> None:
        self.parts[name] = t

    def to_host(self) -> dict[str, list]:
        if all(t.device.type == "cpu" for t in self.parts.values()):
            return {name: t.tolist() for name, t in self.parts.items()}
        flat = torch.cat([t.to(torch.float64).reshape(-1) for t in self.parts.values()]).cpu()  # (total,)
        out, n = {}, 0
        for name, t in self.parts.items():
            out[name] = flat[n:n + t.numel()].view(t.shape).tolist()
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


def _final_p(final: tuple[Candidates, torch.Tensor], token: int) -> float:
    """A drawn row's final probability of `token` (Mirostat's μ moves by it)."""
    pos, present = final[0].at(torch.tensor([token]))
    return float(final[1][pos[0]]) if bool(present[0]) else 0.0


def raw_stats(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Each row's k largest logits (values, ids: (R, k), sorted, equal ones by id so the first is
    argmax's choice) and, with e = exp(logits - max), z = sum(e) and m = sum(e * logits) (R,)
    summed in float64. On a CPU one kernel call for every row, each row alone (kernels.row_stats);
    elsewhere, or with a NaN, torch's operators row by row."""
    stats = kernels.row_stats(logits, k)
    if stats is not None:
        return stats
    vals, ids = logits.topk(k, dim=-1)  # (R, k)
    z, m = [], []
    for r in range(logits.shape[0]):  # one row at a time: its sums in one order whatever the batch
        e = (logits[r] - vals[r, :1]).exp()  # (V,)
        z.append(e.sum(dtype=torch.float64))
        m.append((e * logits[r]).nan_to_num(nan=0.0).sum(dtype=torch.float64))
    return vals, ids, torch.stack(z), torch.stack(m)


def pick_rows(logits: torch.Tensor, rows: list[RowSampling]) -> list[StepInfo]:
    """Sample each row of logits (R, vocab) with its own settings and generator, and gather what
    each step reports. The statistics of every row come from one pass (raw_stats) and leave the
    device in one transfer; each row's numbers are computed alone, the same alone or in a batch."""
    if not rows:  # a step of prompt chunks only
        return []
    R, V = logits.shape
    top_n = min(max(row.top_n for row in rows), V)
    vals, ids, z, m = raw_stats(logits, max(top_n, 1))  # (R, k) each, and (R,)
    dev = logits.device
    # ---- the token of every row, decided here: greedy's argmax (the top-k's first unless a stage
    # before temperature changed the row), a draw from the run's final distribution, or a given one
    next_id = ids[:, 0].clone()  # (R,)
    finals: dict[int, tuple[Candidates, torch.Tensor]] = {}  # the rows that draw: final logits, probabilities
    # Rows whose stages all left the logits as they were: their final distribution is the raw
    # one, and reports the raw numbers (a float32 softmax differs from them in the last digit).
    unchanged = torch.zeros(R, dtype=torch.bool)  # (R,)
    # Per candidate, the position in its run's stage order of the stage that removed it (-1: none).
    removed = torch.full((R, top_n), -1, dtype=torch.long, device=dev)  # (R, top_n)
    overflowed = torch.zeros(R, dtype=torch.bool, device=dev)  # (R,): a draw past its distribution
    penalized = {}  # a greedy row's logits after the stages before temperature, where they moved
    for i, row in enumerate(rows):
        raw = logits[i]  # (V,): one view, which an unchanged row's stages hand back
        if row.params.greedy:
            pen = greedy_logits(raw, row.params, row.state)
            if pen is not raw:
                penalized[i] = pen
                next_id[i] = pen.argmax()
            continue
        final = final_candidates(raw, row.params, row.state, ids[i, :top_n])
        removed[i], unchanged[i] = final.removed, final.unchanged
        probs = final.values.softmax(dim=-1)  # (V,) or (n,): over the candidates left, in vocabulary order
        finals[i] = (final, probs)
    rests = _draw(finals, rows, ids, next_id, overflowed)
    for i, row in enumerate(rows):  # a forced row's numbers are its distribution's; its token is given
        if row.forced is not None:
            next_id[i] = row.forced
    constrained = [i for i, row in enumerate(rows) if row.state is not None and row.state.constraint is not None]
    empty = torch.zeros(R, dtype=torch.bool, device=dev)  # (R,)
    for i in constrained:
        # A constraint can forbid every token the stages before it kept: an empty distribution
        # (its draw runs past the vocabulary), or greedy's argmax of -inf everywhere.
        empty[i] = ~(finals[i][1].sum() > 0) if i in finals else ~torch.isfinite(penalized.get(i, logits[i]).max())
    overflowed &= ~empty  # an emptied constrained row ends with its own reason
    next_id.clamp_(max=V - 1)
    # Which stage removed the last allowed token, where none was left (a host sync for constrained rows only).
    emptied = {i: constrain.emptied_by(logits[i], rows[i].params, rows[i].state, stages(rows[i].params, rows[i].state))
               for i in constrained if bool(empty[i])}
    if top_n == 0:
        if bool(overflowed.any()):
            raise InputError(NO_DISTRIBUTION)
        nan = float("nan")
        # Mirostat's μ moves by the chosen token's final probability: read for its rows only.
        return [StepInfo(t, _final_p(finals[i], t) if i in finals else 1.0 if row.params.mirostat_tau > 0 else nan,
                         nan, [], nan, 0, nan, nothing_left=bool(empty[i]), emptied_by=emptied.get(i, ""))
                for i, (t, row) in enumerate(zip(next_id.tolist(), rows))]

    # ---- the chosen token's logit and rank: its place among the top-k where it is there (every
    # larger logit is there too), else a count over its row
    costs = {i: _cost(logits[i], rows[i], finals.get(i), int(next_id[i])) for i in constrained if not bool(empty[i])}
    top_ids = ids[:, :top_n]  # (R, top_n)
    chosen_logit = logits.gather(1, next_id[:, None])  # (R, 1)
    listed = (ids == next_id[:, None]).any(dim=1)  # (R,)
    above = (vals > chosen_logit).sum(dim=1)  # (R,): right where listed
    for i in (~listed).nonzero().flatten().tolist():
        above[i] = (logits[i] > chosen_logit[i]).count_nonzero()  # (no int64 copy of the row, as sum() makes)
    # ---- the final probabilities of the chosen token and the candidates: a greedy row's are its
    # one-hot; a drawn row's from its distribution, and the rest of it summed in float64
    final_chosen = torch.ones(R, 1, dtype=logits.dtype, device=dev)  # (R, 1)
    final_top = (top_ids == next_id[:, None]).to(logits.dtype)  # (R, top_n)
    unlisted = torch.zeros(R, 1, dtype=torch.float64, device=dev)  # (R, 1); greedy's: 0
    for i, (final, probs) in finals.items():
        pos, present = final.at(torch.cat([ids[i], next_id[i:i + 1]]))  # the candidates, then the chosen
        listed = probs[pos] * present  # (k + 1,): 0 where cut
        final_chosen[i, 0], final_top[i] = listed[-1], listed[:top_n]
        if i in rests:  # summed where it was drawn
            unlisted[i, 0] = rests[i]
            continue
        rest = probs.index_fill(0, pos[present], 0.0)  # every token not listed
        unlisted[i, 0] = rest.sum(dtype=torch.float64)
    packed = _Packed()
    packed.add("token", next_id)
    packed.add("final_chosen", final_chosen)
    packed.add("logit_chosen", chosen_logit)
    packed.add("z", z)
    packed.add("z_mean", m)
    packed.add("rank", above + 1)
    packed.add("top_logits", vals)
    packed.add("top_ids", ids)
    packed.add("final_top", final_top)
    packed.add("unchanged", unchanged.to(dev))
    packed.add("removed", removed)
    packed.add("unlisted", unlisted)
    if constrained:  # the raw mass of the forbidden tokens, and which candidates they are
        forbidden_z = torch.zeros(R, dtype=torch.float64, device=dev)  # (R,)
        top_forbidden = torch.zeros(R, ids.shape[1], dtype=torch.bool, device=dev)  # (R, k)
        for i in constrained:
            forbidden = ~rows[i].state.constraint.allowed.to(dev)  # (V,)
            # The same exponentials as the row's z (raw_stats), so that the masked mass is at most 1.
            fz = kernels.masked_exp_sum(logits[i], float(vals[i, 0]), forbidden)
            forbidden_z[i] = fz if fz is not None else \
                (logits[i] - vals[i, :1]).exp().masked_fill(~forbidden, 0).sum(dtype=torch.float64)
            top_forbidden[i] = forbidden[ids[i]]
        packed.add("forbidden_z", forbidden_z)
        packed.add("top_forbidden", top_forbidden)
        packed.add("empty", empty)
    packed.add("overflowed", overflowed)
    host = packed.to_host()  # Python numbers, once
    if any(host["overflowed"]):  # which row's: the scheduler samples each alone
        raise InputError(NO_DISTRIBUTION)
    infos = [_info(host, r, row.top_n, row.params, costs.get(r)) for r, row in enumerate(rows)]
    for i, name in emptied.items():
        infos[i].emptied_by = name
    return infos


def _draw(finals: dict[int, tuple[Candidates, torch.Tensor]], rows: list[RowSampling], ids: torch.Tensor,
          next_id: torch.Tensor, overflowed: torch.Tensor) -> dict[int, float]:
    """Each drawn row's token into next_id, from its final distribution and its own generator (one
    uniform number each, as sample() draws it). A distribution that is not one (a stage's numbers
    overflowed float32: NaN) draws past its end: overflowed, and the row is refused by the caller.
    The rows over the whole vocabulary are drawn in one kernel call on a CPU (kernels.draw_rows:
    the same tokens as sample(), without its float64 copies of each row: at 8 rows sampled at
    temperature 1 those copies, its cumulative sums and the sums below took 3 of pick_rows'
    4.4-5.0 ms on a 2-core EPYC), which also sums each one's final probability outside its
    candidates and its token: returned by row, for pick_rows' `unlisted`."""
    whole = [i for i, (final, _) in finals.items() if final.ids is None]
    us = {i: torch.rand((1,), generator=rows[i].generator, dtype=torch.float64, device=probs.device)
          for i, (_, probs) in finals.items()}  # (1,) each, from the row's own generator, where it draws
    rests: dict[int, float] = {}
    if whole:
        forced = torch.tensor([-1 if rows[i].forced is None else rows[i].forced for i in whole])  # (D,)
        drawn = kernels.draw_rows([finals[i][1] for i in whole], torch.cat([us[i] for i in whole]),
                                  ids[whole], forced)  # D rows of (V,) probabilities, (D,), (D, k), (D,)
        if drawn is not None:
            for i, token, rest in zip(whole, *(t.tolist() for t in drawn)):
                next_id[i], overflowed[i], rests[i] = token, token >= finals[i][1].numel(), rest
    for i, (final, probs) in finals.items():
        if i in rests:
            continue
        drawn = sample(probs.unsqueeze(0), rows[i].generator, us[i])[0, 0]
        overflowed[i] = drawn >= probs.numel()
        next_id[i] = drawn if final.ids is None else final.ids[drawn.clamp(max=final.ids.numel() - 1)]
    return rests


def _cost(raw: torch.Tensor, row: RowSampling, final: tuple[Candidates, torch.Tensor] | None,
          token: int) -> ConstraintCost:
    """A constrained row's cost of its constraint, from the logits it was sampled from: a drawn
    row's final logits (over the whole vocabulary again where a cutoff compacted them) against
    its stages without the constraint; a greedy row's argmax against the free argmax."""
    if final is None:
        return greedy_cost(raw, row.params, row.state, token)
    c = final[0]
    full = c.values if c.ids is None else torch.full_like(raw, -math.inf).index_copy_(0, c.ids, c.values)  # (V,)
    return drawn_cost(raw, full, row.params, row.state, token, row.top_n)


def _removed_by(host: dict, r: int, top_n: int, params: SamplingParams, token_id: int) -> dict[int, str]:
    """Which stage removed each candidate of row r: by its setting name."""
    ids = host["top_ids"][r][:top_n]
    if params.greedy:  # temperature 0 keeps the one token (a forbidden one is the constraint's)
        return {int(i): "temperature" for i in ids if int(i) != token_id}
    names = order(params.sampler_order)
    return {int(i): names[int(k)] for i, k in zip(ids, host["removed"][r][:top_n]) if k >= 0}


def _info(host: dict, r: int, top_n: int, params: SamplingParams, cost: ConstraintCost | None = None) -> StepInfo:
    """Row r's numbers from the host copy (Python lists), with its own number of candidates."""
    token_id = int(host["token"][r])
    if top_n == 0:
        nan = float("nan")
        return StepInfo(token_id, nan, nan, [], nan, 0)
    z, m = host["z"][r], host["top_logits"][r][0]
    lse = m + math.log(z)
    entropy = lse - host["z_mean"][r] / z
    # exp(logit - lse) for the chosen token and the candidates alike: one number for one thing.
    prob, raw_prob = host["final_chosen"][r][0], math.exp(host["logit_chosen"][r][0] - lse)
    top = [(int(i), p, math.exp(v - lse)) for i, p, v in zip(
        host["top_ids"][r][:top_n], host["final_top"][r][:top_n], host["top_logits"][r][:top_n])]
    if host["unchanged"][r]:  # no stage moved the distribution: the final one is the raw one
        prob, top = raw_prob, [(i, raw, raw) for i, _, raw in top]
    if token_id not in {i for i, _, _ in top}:  # the chosen token is always listed
        top.append((token_id, prob, raw_prob))
    masked, forbidden, empty = 0.0, frozenset(), False
    if "forbidden_z" in host:
        masked = host["forbidden_z"][r] / z
        forbidden = frozenset(i for (i, _, _), f in zip(top, host["top_forbidden"][r][:top_n]) if f)
        empty = bool(host["empty"][r])
    info = StepInfo(token_id, prob, raw_prob, top, entropy, int(host["rank"][r]), masked, forbidden, empty,
                    _removed_by(host, r, top_n, params, token_id), _unlisted(host, r, top_n, token_id))
    if cost is not None:  # a removed token's raw p as every candidate's: exp(logit - lse)
        info.constraint_kl, info.free_prob = cost.kl, cost.free_prob
        info.constraint_removed = [(i, p, math.exp(logit - lse)) for i, p, logit in cost.removed]
    return info


def _unlisted(host: dict, r: int, top_n: int, token_id: int) -> float:
    """Row r's final probability outside its own top_n candidates and its token: the batch's
    sum, plus the candidates the batch gathered beyond this row's top_n."""
    beyond = zip(host["top_ids"][r][top_n:], host["final_top"][r][top_n:])
    return host["unlisted"][r][0] + sum(p for i, p in beyond if int(i) != token_id)


def candidates(info: StepInfo, piece) -> list[Candidate]:
    """The step's candidates as events carry them; piece(id) spells a token."""
    return [Candidate(i, piece(i), p, r, i in info.forbidden, info.removed_by.get(i, ""))
            for i, p, r in info.top]
