"""What many samples say about the first step: each token's observed count beside the count
the model's probabilities expect, and Pearson's chi-square goodness of fit. Pure functions."""

from __future__ import annotations

import math
from dataclasses import dataclass

# A group of tokens enters the chi-square only with an expected count of at least this
# (Cochran's rule): rarer tokens are pooled until their group reaches it.
MIN_EXPECTED = 5.0
OTHER = None  # the id of "every token not among the listed candidates"


def chi2_sf(x: float, df: int) -> float:
    """P(X ≥ x) for X chi-square with df (a whole number ≥ 1) degrees of freedom: the upper
    regularized incomplete gamma Q(df/2, x/2) in closed form. Even df: e^-h Σ_{i<df/2} h^i/i!;
    odd df: erfc(√h) + e^-h Σ_{i=1}^{(df-1)/2} h^(i-1/2)/Γ(i+1/2), with h = x/2. Terms are
    taken in logs, so a large x underflows to 0 rather than overflowing."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, got {df}")
    if x <= 0:
        return 1.0
    h = x / 2
    if df % 2 == 0:
        total = sum(math.exp(-h + i * math.log(h) - math.lgamma(i + 1)) for i in range(df // 2))
    else:
        total = math.erfc(math.sqrt(h)) + sum(math.exp(-h + (i - 0.5) * math.log(h) - math.lgamma(i + 0.5))
                                              for i in range(1, (df + 1) // 2))
    return min(1.0, total)


@dataclass
class Row:
    """One token of the first step (id OTHER: all the tokens not listed)."""
    id: int | None
    piece: str
    observed: int
    prob: float  # the model's probability, in the distribution sampled from (mean over samples)
    expected: float  # the count the samples should show: the sum of each sample's probability


@dataclass
class Fit:
    statistic: float
    df: int
    p_value: float
    groups: list[list[Row]]  # the groups compared, each one token or pooled rare ones


def first_step_rows(firsts: list, piece) -> list[Row] | None:
    """Each listed candidate's observed count, probability and expected count over the samples'
    first steps (their StepEvents: the same context, so the same candidates), most likely
    first, then every other token as one row. None where a probability is unknown (in front
    of a server that gives only the raw distribution)."""
    if not firsts:
        return []
    # The candidates every sample lists (a sample also lists its own token when it is not
    # among them): the same context gives the same top candidates.
    common = set.intersection(*({c.id for c in ev.top} for ev in firsts))
    ids = [c.id for c in firsts[0].top if c.id in common]
    per_sample = []
    for ev in firsts:
        probs = {c.id: c.prob for c in ev.top}
        if any(probs.get(i) is None for i in ids):
            return None
        per_sample.append(probs)
    n = len(firsts)
    rows = [Row(i, piece(i), sum(ev.token_id == i for ev in firsts), sum(p[i] for p in per_sample) / n,
                sum(p[i] for p in per_sample)) for i in ids]
    rows.sort(key=lambda r: -r.prob)
    other_seen = sum(ev.token_id not in common for ev in firsts)
    if all(ev.unlisted_prob is not None for ev in firsts):
        # As the engine summed it, plus what a sample lists beyond the common candidates:
        # exactly 0 where the stages removed every other token (1 - the listed sum would
        # leave float residue, 4e-08).
        other = sum(ev.unlisted_prob + sum(c.prob for c in ev.top if c.id not in common) for ev in firsts)
    else:  # what the listed candidates leave: float rounding can make it a hair below 0
        other = max(0.0, n - sum(r.expected for r in rows))
    rows.append(Row(OTHER, "every other token", other_seen, other / n, other))
    return rows


def goodness_of_fit(rows: list[Row]) -> Fit | None:
    """Pearson's chi-square of the observed counts against the expected ones. Tokens with an
    expected count of at least MIN_EXPECTED are groups of their own; the rest are pooled into
    one group (with "every other token"), and a pool still under MIN_EXPECTED joins the
    smallest group. None when fewer than two groups remain (too few samples, or one token
    takes all the probability: greedy)."""
    possible = [r for r in rows if r.expected > 0]
    alone = sorted([r for r in possible if r.expected >= MIN_EXPECTED], key=lambda r: r.expected)
    pooled = [r for r in possible if r.expected < MIN_EXPECTED]
    groups = [[r] for r in alone]
    if pooled:
        if sum(r.expected for r in pooled) >= MIN_EXPECTED or not groups:
            groups.append(pooled)
        else:
            groups[0] = groups[0] + pooled  # the smallest group takes the pool
    if len(groups) < 2:
        return None
    stat = 0.0
    for g in groups:
        o, e = sum(r.observed for r in g), sum(r.expected for r in g)
        stat += (o - e) ** 2 / e
    df = len(groups) - 1  # no parameter is estimated from the samples
    return Fit(stat, df, chi2_sf(stat, df), groups)
