"""What the many-samples panel shows: the distinct outcomes with their counts, and the first step's
observed frequencies beside the model's probabilities with the chi-square figure. Pure functions
of a SampleBatch, no Gradio."""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

from inference.events import DoneEvent, StepEvent
from ui.format import REASONS, fmt_p, token_label
from ui.samples.stats import MIN_EXPECTED, OTHER, Fit, Row, first_step_rows, goodness_of_fit

SEEDS_LISTED = 6  # an outcome lists this many of its seeds, then how many more
POOL_NAMED = 5  # the chi-square's pooled group names this many of its rows


@dataclass
class SampleBatch:
    """What the page keeps of N samples: each one's first step, its token count and its end."""
    n: int
    seed: int
    first: dict[int, StepEvent] = field(default_factory=dict)  # sample k -> its step 0
    tokens: Counter = field(default_factory=Counter)  # sample k -> tokens made so far
    done: dict[int, DoneEvent] = field(default_factory=dict)

    def add(self, k: int, ev) -> None:
        if isinstance(ev, StepEvent):
            self.tokens[k] += 1
            if ev.step == 0:
                self.first[k] = ev
        elif isinstance(ev, DoneEvent):
            self.done[k] = ev

    @property
    def stopped(self) -> bool:
        return any(d.reason == "cancelled" for d in self.done.values())


def ratio(k: int, n: int, scale: int = 1, exact_to: int = 6, approx_to: int = 4) -> str:
    """k/n × scale, exact where its decimals end within exact_to places (1 of 8 is 12.5%, 1 of 64
    1.5625%), else ≈ to approx_to places (1 of 3: ≈33.3%): a few samples' shares are not rounded away."""
    for places in range(exact_to + 1):
        if k * scale * 10**places % n == 0:
            return f"{k * scale / n:.{places}f}"
    return f"≈{k * scale / n:.{approx_to}f}"


def progress_md(b: SampleBatch) -> str:
    return (f"Drawing {b.n} samples (seeds {b.seed}–{b.seed + b.n - 1}) in one batch: {len(b.done)} done, "
            f"{sum(b.tokens.values()):,} tokens so far…")


def failed_md(b: SampleBatch, line: str) -> str:
    return (f"⚠ The samples failed after {len(b.done)} of {b.n} had ended ({sum(b.tokens.values()):,} tokens): "
            f"{line}")


def summary_md(b: SampleBatch) -> str:
    made = sum(b.tokens.values())
    head = (f"**{b.n} samples**, seeds {b.seed}–{b.seed + b.n - 1} (sample k used seed {b.seed} + k: "
            f"each is the run Generate makes with that seed), {made:,} tokens in all.")
    if b.stopped:
        unfinished = sum(d.reason == "cancelled" for d in b.done.values())
        head += f" **Stopped**: {unfinished} sample{'s' if unfinished != 1 else ''} ended early; their texts are cut short."
    return head


def outcomes_html(b: SampleBatch) -> str:
    """The distinct texts, most frequent first: count, share, the seeds that made each, why they ended."""
    if not b.done:
        return ""
    by_text: dict[str, list[int]] = {}
    for k in sorted(b.done):
        by_text.setdefault(b.done[k].text, []).append(k)
    rows = []
    for text, ks in sorted(by_text.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        seeds = ", ".join(str(b.done[k].seed) for k in ks[:SEEDS_LISTED])
        if len(ks) > SEEDS_LISTED:
            seeds += f" and {len(ks) - SEEDS_LISTED} more"
        reasons = sorted({b.done[k].reason for k in ks})
        why = "; ".join(REASONS.get(r, r) for r in reasons)
        shown = html.escape(text).replace("\n", "↵\n") if text else "<i>(no text)</i>"
        rows.append(f"<tr><td class='tl-num'>{len(ks)}</td><td class='tl-num'>{ratio(len(ks), len(b.done), 100, 4, 1)}%</td>"
                    f"<td><div class='tl-sample-text'>{shown}</div></td><td>{seeds}</td><td>{html.escape(why)}</td></tr>")
    return (f"<p>{len(by_text)} distinct text{'s' if len(by_text) != 1 else ''} among {len(b.done)} samples.</p>"
            "<div class='tl-samples-wrap'><table class='tl-samples'><tr><th>count</th><th>share</th><th>text</th>"
            f"<th>seeds</th><th>ended</th></tr>{''.join(rows)}</table></div>")


def _label(r: Row) -> str:
    return "<i>every other token</i>" if r.id is OTHER else f"<code>{html.escape(token_label(r.piece))}</code>"


def first_step_html(b: SampleBatch, piece) -> str:
    """Step 0 of every sample: each token's observed frequency beside the model's probability
    (the final distribution, the one sampled from), and the chi-square agreement figure."""
    firsts = [b.first[k] for k in sorted(b.first)]
    if not firsts:
        return ""
    rows = first_step_rows(firsts, piece)
    if rows is None:
        return ("<p>The first step's probabilities in the distribution sampled from are not known here "
                "(the server returns the model's own), so they cannot be compared with the samples.</p>")
    n = len(firsts)
    body = "".join(
        f"<tr><td>{_label(r)}</td><td class='tl-num'>{r.observed}</td><td class='tl-num'>{ratio(r.observed, n)}</td>"
        f"<td class='tl-num'>{fmt_p(r.prob)}</td><td class='tl-num'>{r.expected:.2f}</td></tr>"
        for r in rows if r.observed or r.expected > 0 or r.id is OTHER)  # "every other token": 0 said
    table = ("<div class='tl-samples-wrap'><table class='tl-samples'><tr><th>first token</th><th>seen</th>"
             "<th>frequency</th><th>model p (sampled from)</th><th>expected count</th></tr>"
             f"{body}</table></div>")
    return (f"<p><b>First step</b> of {n} samples: how often each token came first, beside the probability "
            "the model gave it after the settings (the distribution each sample drew from).</p>"
            + table + fit_html(goodness_of_fit(rows), n, rows))


def fit_html(fit: Fit | None, n: int, rows: list[Row]) -> str:
    """The chi-square line; without a test, why: the reason that applies to these samples."""
    if fit is None:
        alone = max((r.expected for r in rows), default=0) >= n * (1 - 1e-6)  # up to float rounding
        why = ("one token has all the probability in the distribution sampled from (greedy, or the settings "
               "kept only it), so there is nothing to compare" if alone else
               f"with {n} samples there are fewer: more samples help")
        return (f"<p><b>Chi-square:</b> no test. It needs at least two groups of tokens each expected at least "
                f"{MIN_EXPECTED:g} times; {why}.</p>")
    pooled = [g for g in fit.groups if len(g) > 1]
    how = ""
    if pooled:
        group = pooled[0]
        names = ", ".join(_label(r) for r in group[:POOL_NAMED])
        more = f" and {len(group) - POOL_NAMED} more" if len(group) > POOL_NAMED else ""
        how = (f" Tokens expected fewer than {MIN_EXPECTED:g} times are pooled into one group of {len(group)} "
               f"rows ({names}{more}), as the test needs.")
    # A test can find a disagreement, never show agreement: a large p-value only finds none.
    verdict = ("no disagreement with the model's probabilities was detected (a deviation at least this large "
               "happens by chance in " + f"{fit.p_value:.0%} of runs)" if fit.p_value >= 0.05 else
               "a deviation this large happens by chance less than 5% of the time")
    return (f"<p><b>Chi-square goodness of fit:</b> χ² = {fit.statistic:.3f}, {fit.df} degree"
            f"{'s' if fit.df != 1 else ''} of freedom, p-value = {fit.p_value:.4f}: {verdict}.{how}</p>")


def samples_json(b: SampleBatch, piece) -> dict:
    """The API's structured answer: every sample, and the first step's table and fit."""
    firsts = [b.first[k] for k in sorted(b.first)]
    rows = first_step_rows(firsts, piece) or []
    fit = goodness_of_fit(rows) if rows else None
    return {"seed": b.seed, "n": b.n,
            "samples": [{"sample": k, "seed": d.seed, "text": d.text, "reason": d.reason,
                         "tokens": b.tokens[k]} for k, d in sorted(b.done.items())],
            "first_step": [{"id": r.id, "piece": r.piece, "observed": r.observed, "prob": r.prob, "expected": r.expected}
                           for r in rows],
            "chi_square": None if fit is None else {"statistic": fit.statistic, "df": fit.df,
                                                    "p_value": fit.p_value}}
