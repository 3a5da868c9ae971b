"""What the sampling experiments show: the per-step charts of a whole run, replay's stage table
and bars, compare A/B and "how likely was X?". Pure functions, no Gradio."""

from __future__ import annotations

import html
import math

import pandas as pd

from inference.events import StepEvent
from inference.sampling.settings import BY_NAME
from ui.format import (NOT_HERE, bucket, fmt_p, known, line_frame, named_prob_html, plotted_p, prob_html, shown_prob,
                       visible)
from ui.glossary import gloss
from ui.run_state import Divergence, RunRecord, run_summary

REPLAY_NOTE = (f"**Replay** recomputes a step from its whole logit vector: {NOT_HERE}, which "
               "returns only the top candidates' log-probabilities (outside them nothing is known). "
               "Compare A/B and \"how likely was X?\" below ask the server again and work.")
CHARTS_CAPTION = ("**Per step of the run**: the chosen token's probability in the distribution it was "
                  "sampled from (under a constraint also the masked mass: the raw probability the constraint "
                  "removed); the entropy of the model's raw distribution, in nats; the chosen token's rank in "
                  "the raw distribution (1: the model's top choice).")
CHARTS_NOTE = ("In front of a server: the raw entropy needs the whole distribution, and a rank is "
               "known only among the returned candidates; steps without them are left out of these "
               "charts, not drawn as zeros.")


def _rank(st) -> str:
    return "removed" if st.chosen_rank is None else f"#{st.chosen_rank}, {prob_html(st.chosen_prob)}"


def _cells(st) -> str:
    return f"{st.kept:,} | {fmt_p(st.mass_removed)} | {_rank(st)}"


def _name(st, off: str = "off") -> str:
    """The stage's label, what it read from the run's state, and whether it is off (at its neutral value)."""
    return st.name + "".join(f" ({x})" for x in (st.note, off if st.off else "") if x)


def _one_pipeline(stats, who: str) -> list[str]:
    """One pipeline's stages, in the order it ran them."""
    return [f"| stage | kept ({who}) | mass removed ({who}) | chosen rank, p ({who}) |", "|---|---|---|---|",
            *(f"| {_name(st)} | {_cells(st)} |" for st in stats)]


def stages_table(original, replayed, tokenizer, chosen: int) -> str:
    """The run's stages beside the replay's, row by row when both run them in the same order;
    else each pipeline in a table of its own, in its own order, so that every column reads top
    to bottom as it ran."""
    lines = [f"Chosen token: **{html.escape(visible(tokenizer.piece(chosen)))}** (id {chosen}).", ""]
    if [st.key for st in original] != [st.key for st in replayed]:
        return "\n".join(lines + ["The run and the replay run the stages in different orders: each is "
                                   "listed in its own.", "", "**The run**, in its order:", "",
                                   *_one_pipeline(original, "run"), "", "**The replay**, in its order:", "",
                                   *_one_pipeline(replayed, "replay")])
    lines += ["| stage | kept (run) | mass removed (run) | chosen rank, p (run) | kept (replay) | "
              "mass removed (replay) | chosen rank, p (replay) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {_name(b, 'off in the replay')}{' (off in the run)' if a.off else ''} | {_cells(a)} | {_cells(b)} |"
              for a, b in zip(original, replayed)]
    return "\n".join(lines)


def replay_bars(step: StepEvent, final_run, final_replay, tokenizer, n: int = 10) -> str:
    """The step's candidates: final in the run (the main bars' final colour), final under the
    replayed settings (a colour of its own)."""
    ids = {c.id for c in step.top}
    values, top = final_replay.topk(n)
    ids |= {i for i, v in zip(top.tolist(), values.tolist()) if v > 0}
    ids = sorted(ids, key=lambda i: (-float(final_replay[i]), -float(final_run[i])))[: n + 2]
    rows = []
    for i in ids:
        chosen = i == step.token_id
        rows.append(
            f"<div class='tl-row{' tl-chosen' if chosen else ''}'>"
            f"<span class='tl-tok'>{'▶ ' if chosen else ''}{html.escape(visible(tokenizer.piece(i)))}</span>"
            f"<span class='tl-bar'><span class='tl-final' style='width:{100 * float(final_run[i]):.2f}%'></span></span>"
            f"<span class='tl-num'>{prob_html(float(final_run[i]))}</span>"
            f"<span class='tl-bar'><span class='tl-replayed' style='width:{100 * float(final_replay[i]):.2f}%'></span></span>"
            f"<span class='tl-num'>{prob_html(float(final_replay[i]))}</span></div>")
    head = ("<div class='tl-row tl-head'><span class='tl-tok'>token</span>"
            "<span class='tl-h2 tl-h-final'>final in the run</span>"
            "<span class='tl-h2 tl-h-replayed'>final, replayed</span></div>")
    return f"<div class='tl-bars'>{head}{''.join(rows)}</div>"


BY_TEXT = "their tokenizers differ, so their texts are compared, not their token ids"


def _chose(name: str, s: StepEvent) -> str:
    return f"{name} chose **{html.escape(visible(s.piece))}** ({named_prob_html(shown_prob(s))})"


def _parting(a: RunRecord, b: RunRecord, d: Divergence) -> str:
    """Where A and B part: by token id, or (d.char set: tokenizers that differ) by text."""
    stopped = "A" if d.a is None else "B"
    if d.char is None:
        if d.a is None or d.b is None:
            return f"**Same tokens until step {d.b if d.a is None else d.a}, where {stopped} stopped.**"
        return f"**First divergence at step {d.a}**: {_chose('A', a.steps[d.a])}, {_chose('B', b.steps[d.b])}."
    why = f" ({BY_TEXT})"
    if d.a is None or d.b is None:
        return f"**Same text until character {d.char}, where {stopped} stopped**{why}."
    return (f"**Their texts first differ at character {d.char}**{why}: at A's step {d.a}, "
            f"{_chose('A', a.steps[d.a])}; at B's step {d.b}, {_chose('B', b.steps[d.b])}.")


def compare_summary(a: RunRecord, b: RunRecord, d: Divergence | None, by_text: bool = False) -> str:
    """Where A and B part (by_text: their tokenizers differ), and each run's numbers."""
    sa, sb = run_summary(a), run_summary(b)
    lines = [_parting(a, b, d) if d is not None else
             f"**A and B produced the same {'text' if by_text else 'tokens'}**{f' ({BY_TEXT})' if by_text else ''}."]
    lines += ["", "| run | tokens | mean chosen-token p (final: sampled from) | mean raw entropy (nats) | "
              "perplexity of its text (raw p: the model's) |", "|---|---|---|---|---|"]
    for name, s in (("A", sa), ("B", sb)):
        entropy, ppl = (f"{x:.3f}" if known(x) else "–" for x in (s["mean_entropy"], s["perplexity"]))
        lines.append(f"| {name} | {s['tokens']} | {fmt_p(s['mean_p'])} | {entropy} | {ppl} |")
    return gloss("\n".join(lines))


def _shown_value(name: str, value) -> str:
    """A setting's value as the comparison names it: a choice by the page's word for it, a number
    as typed, a text quoted (a long one cut, as it is only told apart)."""
    s = BY_NAME[name]
    if s.control == "choice":
        return dict(s.choices).get(value, str(value))
    if isinstance(value, str):
        text = " ".join(value.split())
        return "empty" if not text else html.escape(repr(text if len(text) <= 24 else text[:23] + "…"))
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return html.escape(str(value))


def settings_differences(a: dict, b: dict, model_a: str = "", model_b: str = "") -> list[str]:
    """Every setting (by schema name: a's and b's values, as the controls hold them) in which B is
    not A, as "Label: A's → B's", the model first. Values are compared as the schema reads them
    (0.5 and "0.50" are one value); a value that cannot be read is compared as typed."""
    def read(name, value):
        try:
            return BY_NAME[name].parse(value)
        except Exception:  # noqa: BLE001 - a value a run would refuse: told apart as typed
            return value
    out = [f"Model: {html.escape(model_a)} → {html.escape(model_b)}"] if model_b and model_a != model_b else []
    for name in a:
        if read(name, a[name]) != read(name, b[name]):
            out.append(f"{BY_NAME[name].label}: {_shown_value(name, a[name])} → {_shown_value(name, b[name])}")
    return out


def differences_md(differences: list[str]) -> str:
    """The line above "Run A and B" (and atop its summary): in what B differs from A."""
    if not differences:
        return ("**B is A**: same model and settings (with the same seed, the same tokens). Change a B setting "
                "below to compare.")
    return f"**B differs from A in {len(differences)} setting{'s' * (len(differences) != 1)}**: " + "; ".join(differences) + "."


def highlighted_with_marker(rec: RunRecord, at: int | None) -> list[tuple[str, str | None]]:
    """The run's text, its step `at` marked as where the runs part."""
    out = [(s.text, "diverges here" if i == at else bucket(shown_prob(s))) for i, s in enumerate(rec.steps)]
    if rec.done and rec.done.tail:
        out.append((rec.done.tail, None))
    return out


def likelihood_table(scores) -> str:
    if not scores:
        return ""
    total = sum(lp for _, _, lp in scores)
    lines = ["| token | id | p | log p |", "|---|---|---|---|"]
    for i, piece, lp in scores:
        lines.append(f"| {html.escape(visible(piece))} | {i} | {fmt_p(math.exp(lp))} | {lp:.3f} |")
    lines.append(f"| **{'the 1 token' if len(scores) == 1 else f'all {len(scores)} tokens'}** | | {fmt_p(math.exp(total))} | {total:.3f} |")
    return "\n".join(lines)


def two_models_md(a: RunRecord, b: RunRecord, two, why: str, tokenizer) -> str:
    """Across two models: where their greedy choices part along A's text, their KL per step
    (every step, in a table that opens), or why they cannot be compared token by token."""
    if a.model == b.model:
        return ""
    head = f"\n\n**Two models**: A is {html.escape(a.model)}, B is {html.escape(b.model)}."
    if two is None:
        return head + f" Their distributions are not compared step by step: {html.escape(why)}."

    def tok(i):
        return html.escape(visible(tokenizer.piece(i)))

    kl = two.kl
    worst = max(range(len(kl)), key=kl.__getitem__)
    lines = [head + " Both read A's text (each after its own prompt); at each step, KL(A‖B) of their raw "
             f"distributions: mean **{sum(kl) / len(kl):.4f} nats**, largest {kl[worst]:.4f} at step {worst}."]
    if two.split is None:
        lines.append(f"Their greedy choices agree at {'the one step' if len(kl) == 1 else f'all {len(kl)} steps'}.")
    else:
        (ia, pa), (ib, pb) = two.top_a[two.split], two.top_b[two.split]
        lines.append(f"**Their greedy choices part first at step {two.split}**: A's top **{tok(ia)}** "
                     f"({prob_html(pa)}), B's top **{tok(ib)}** ({prob_html(pb)}).")
    rows = "".join(f"<tr><td>{i}</td><td>{tok(t)}</td><td>{prob_html(p_a)}</td><td>{prob_html(p_b)}</td>"
                   f"<td>{k:.4f}</td><td>{tok(ta)}</td><td>{tok(tb)}</td></tr>"
                   for i, ((t, p_a, p_b), k, (ta, _), (tb, _)) in
                   enumerate(zip(two.chosen, kl, two.top_a, two.top_b)))
    lines.append("<details><summary>Every step</summary><table><tr><th>step</th><th>A's token</th><th>p under A</th>"
                 "<th>p under B</th><th>KL(A‖B)</th><th>A's top</th><th>B's top</th></tr>"
                 f"{rows}</table></details>")
    return "\n\n".join(lines)


def two_models_frame(two) -> pd.DataFrame:
    """The per-step chart across two models: KL(A‖B) and the probability each gave A's token."""
    rows = []
    for i, ((_, pa, pb), k) in enumerate(zip(two.chosen, two.kl) if two is not None else ()):
        rows += [{"step": i, "value": round(k, 4), "series": "KL(A‖B), nats"},  # 4 decimals, as the summary's
                 {"step": i, "value": plotted_p(pa), "series": "p of A's token under A"},
                 {"step": i, "value": plotted_p(pb), "series": "p of A's token under B"}]
    return line_frame(rows, "value", "series")
