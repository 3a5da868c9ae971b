"""What a constrained run's constraint cost, as the run's statistics show it: the output's log p
with and without the constraint's renormalisation (the engine's DoneEvent.logprob and
free_logprob), and each step's masked mass, KL(constrained ‖ free), the chosen token's p in the
distribution sampled from and in the free one, and the free one's top tokens the constraint
removed. The engine computed each in the step that sampled (inference/sampling/constraint_cost.py):
nothing here is recomputed. Pure functions of a run's record; nothing where the engine does not
report them (a server's). The bars give one step's (ui/format.cost_html)."""

from __future__ import annotations

import html
import math

from ui.format import fmt_kl, fmt_p, piece_html, prob_html, removed_html
from ui.run_state import RunRecord


def logp_text(logp: float | None) -> str:
    """A run's log p: 3 decimals, −∞ where one of its tokens had p 0 there."""
    if logp is None:
        return "–"
    return "−∞ (a token of it had p 0 there)" if math.isinf(logp) else f"{logp:.3f}"


def cost_rows(rec: RunRecord) -> list[tuple[str, str]]:
    """The statistics' rows (measure, value) of an ended constrained run: its output's log p with
    the constraint's renormalisation and in the free distribution (cost_note says which is which);
    none for another run."""
    done = rec.done
    if done is None or getattr(done, "logprob", None) is None:
        return []
    return [("log p, renormalised", logp_text(done.logprob)),
            ("log p, free distribution", logp_text(done.free_logprob))]


def steps_html(rec: RunRecord) -> str:
    """An ended constrained run's cost at each step, one row a step, folded under its summary
    (a long run's table would push the statistics away): "" for another run, or while it runs."""
    steps = [s for s in rec.steps if s.constraint_kl is not None]
    if rec.done is None or not steps:
        return ""
    rows = "".join(
        f"<tr><td>{s.step}</td><td>{piece_html(s.piece)}</td>"
        f"<td>{fmt_p(s.masked_mass)}</td><td>{fmt_kl(s.constraint_kl)}</td><td>{prob_html(s.prob)}</td>"
        f"<td>{prob_html(s.free_prob)}</td><td>{removed_html(s) or 'none'}</td></tr>" for s in steps)
    n = len(steps)
    return ("<details class='tl-cost-steps' id='cost-steps'><summary>What the constraint cost at each step "
            f"({n:,} step{'s' if n != 1 else ''})</summary><div class='tl-cost-scroll'><table>"
            "<thead><tr><th>step</th><th>token</th><th>masked mass</th><th>KL (nats)</th><th>p</th><th>free p</th>"
            "<th>top tokens of the free distribution it removed</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div></details>")


def cost_note(rec: RunRecord) -> str:
    """One line under an ended constrained run's statistics: what its two log p are."""
    if not cost_rows(rec):
        return ""
    done = rec.done
    said = ("The output's log p: with the constraint, each step's distribution renormalised over the tokens it "
            "allows (the one sampled from); in the free distribution, the same stages at the same step without "
            "it. Each is the sum of the output's tokens' log p there")
    if done.free_logprob is None:
        return said + "."
    gap = "∞" if math.isinf(done.free_logprob) else f"{done.logprob - done.free_logprob:.3f}"
    return said + f": they differ by {html.escape(gap)}."
