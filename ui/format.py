"""Formatting shared by every section of the page: numbers, probabilities, token labels and the
candidate bars. Pure functions, no Gradio."""

from __future__ import annotations

import html
import math

import pandas as pd

from inference.device import dtype_name
from inference.events import DoneEvent, StepEvent
from inference.loading.byte_pieces import byte_hint, short_hint
from inference.lesson.summary import si  # noqa: F401 - the one SI formatter, the CLI's lesson's too
from inference.sampling.penalties import BAN
from inference.sampling.stages import STAGES
from ui.glossary import gloss

# Probability buckets for colouring generated tokens (HighlightedText categories).
BUCKETS = [(0.9, "p ≥ 0.9"), (0.5, "0.5 ≤ p < 0.9"), (0.1, "0.1 ≤ p < 0.5"), (0.0, "p < 0.1")]


COLOR_MAP = {"p ≥ 0.9": "#2e7d32", "0.5 ≤ p < 0.9": "#9ccc65", "0.1 ≤ p < 0.5": "#ffb300",
             "p < 0.1": "#e53935"}


# Compare A/B marks the first step where A and B differ; only its outputs have that entry.
COMPARE_COLOR_MAP = {**COLOR_MAP, "diverges here": "#8e24aa"}


# Why a run ended, as the page says it after "Run ended:".
REASONS = {"eos": "the model emitted its end-of-sequence token", "length": "max new tokens reached",
           "stop": "a stop string was found", "context": "the context window is full",
           "cancelled": "stopped on request (Stop, or a new run in this tab)",
           "complete": "the constraint is complete",
           "constraint": "no token the constraint allows was left to draw from"}


def forced_end(step) -> bool:
    """Whether a step's end-of-sequence token was the only token its constraint allowed: the raw
    probability the constraint kept is that token's alone (the constraint was complete, the model
    did not choose to end)."""
    masked, raw = getattr(step, "masked_mass", None), getattr(step, "raw_prob", None)
    return bool(masked) and raw is not None and abs((1.0 - masked) - raw) <= 1e-6 * max(raw, 1e-30) + 1e-12


def reason_text(done, last_step=None) -> str:
    """Why a run ended, as the page says it after "Run ended:"; under a sampler order that left no
    token the constraint allows, the stage that removed the last one, by its label; an end of
    sequence the constraint forced (last_step: the run's last step), said as the constraint's."""
    if done.reason == "eos" and last_step is not None and forced_end(last_step):
        return "the constraint was complete (its end-of-sequence token was the only token it allowed)"
    said = REASONS.get(done.reason, done.reason)
    stage = getattr(done, "emptied_by", None)
    if done.reason != "constraint" or not stage or stage == "constraint" or stage not in STAGES:
        return said
    label = STAGES[stage][0]
    return (f"{label} removed the last token the constraint allows, so none was left to draw from (move "
            f"constraint before {stage} in the sampler order, its default place is first, or loosen {label})")


def count(n: int, word: str, plural: str | None = None) -> str:
    """"1 token", "2 tokens", "1,024 tokens": a number and its noun in the number's grammar."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def mib(n: float) -> str:
    """Bytes in MiB, as the KV-cache panel gives every size (its chart's axis is in MiB)."""
    return f"{n / 2**20:,.2f} MiB"


def binary_size(n: float) -> str:
    """Bytes in the page's binary units, two decimals as mib's: 4 B, 137.25 KiB, 108.00 MiB."""
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 2**power:
            return f"{n / 2**power:,.2f} {unit}"
    return f"{n:,.0f} B"


def bucket(p: float | None) -> str | None:
    if p is None:
        return None
    return next(name for threshold, name in BUCKETS if p >= threshold)


def shown_prob(s: StepEvent) -> float | None:
    """The probability a token is coloured by: the one it was sampled with, else (in front of
    a server that gives only the raw distribution) the model's own."""
    return s.prob if s.prob is not None else s.raw_prob


def known(x) -> bool:
    """A number the engine knows: not None (in front of a server) and not NaN (no steps)."""
    return x is not None and x == x


def visible(text: str) -> str:
    """Whitespace made visible for token labels: ␣ space, ↵ newline, ⇥ tab, ∅ no text."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") if text else "∅"


def fmt_p(p: float | None) -> str:
    """A probability as shown everywhere: 4 decimals, or 3 significant digits below 1e-4 so that
    small numbers stay visible, and as many decimals as it takes (to 9) for one just under 1 not to
    read as 1 (a constraint that removed 0.99997 of the raw probability did not remove all of it);
    a dash where the engine does not know it."""
    if not known(p):
        return "–"
    if p < 1e-4 and p != 0:
        return f"{p:.3g}"
    digits = 4
    while p < 1 and digits < 9 and f"{p:.{digits}f}" == f"{1:.{digits}f}":
        digits += 1
    return f"{p:.{digits}f}"


def plotted_p(p: float) -> float:
    """A probability as a chart plots it: the number fmt_p prints, so that a chart's tooltip reads
    what the bars and tables read (Vega-Lite's tooltip would print ten digits); NaN, which the
    chart leaves out, where the engine does not know it."""
    return float(fmt_p(p)) if known(p) else math.nan


def fmt_logp(p: float | None) -> str:
    if not known(p):
        return "–"
    return f"{math.log(p):.3f}" if p > 0 else "−∞"


def prob_html(p: float) -> str:
    """p and log p, one shown at a time by the page's switch (PROB_CSS)."""
    return f"<span class='tl-p'>{fmt_p(p)}</span><span class='tl-lp'>{fmt_logp(p)}</span>"


def named_prob_html(p: float | None, prefix: str = "") -> str:
    """"p = 0.8800" or "log p = -0.128": the "log " is switched with the number (PROB_CSS), so log
    mode never shows a log value called p. `prefix` goes before either ("raw ")."""
    return f"{prefix}<span class='tl-lp'>log </span>p = {prob_html(p)}"


def chosen_prob_html(prob: float | None, raw_prob: float | None) -> str:
    """The chosen token's probability and the model's own: "p = 0.8800 (raw p = 0.5000)"."""
    return f"{named_prob_html(prob)} ({named_prob_html(raw_prob, 'raw ')})"


def bucket_class(p: float | None) -> str:
    """The colour class of a probability; tl-bu (uncoloured) where the engine does not know it."""
    if not known(p):
        return "tl-bu"
    return f"tl-b{next(i for i, (threshold, _) in enumerate(BUCKETS) if p >= threshold)}"


def _bar(kind: str, p: float | None, mark: str = "") -> str:
    width = 100 * p if known(p) else 0.0
    return (f"<span class='tl-bar'><span class='{kind}' style='width:{width:.2f}%'></span>{mark}</span>"
            f"<span class='tl-num'>{prob_html(p)}</span>")


def bias_mark(bias: float | None) -> str:
    """The tag on a candidate's final bar that says why it moved: "banned", "bias +2"."""
    if bias is None:
        return ""
    if bias <= BAN:
        return "<span class='tl-mark tl-banned' title='logit bias: banned'>banned</span>"
    return f"<span class='tl-mark' title='logit bias added to its logit'>bias {bias:+g}</span>"


# On a narrow screen the final bar is narrower than the word: a cross instead (page.css).
FORBIDDEN_MARK = ("<span class='tl-mark tl-banned' title='the constraint forbids it at this step'>"
                  "<span class='tl-long'>forbidden</span><span class='tl-short'>✕</span></span>")


def final_mark(c, bias: dict[int, float] | None) -> str:
    """Why a candidate's final bar is what it is: forbidden by the constraint, banned or moved by
    the logit bias, or removed by a stage (top-k, top-p, ...)."""
    if c.forbidden:
        return FORBIDDEN_MARK
    moved = (bias or {}).get(c.id)
    if moved is not None:
        return bias_mark(moved)
    return removed_mark(getattr(c, "removed_by", ""))


def removed_mark(stage: str | None) -> str:
    """The tag on a candidate's final bar that names the sampling stage that removed it ("top-p")."""
    if not stage:
        return ""
    if stage not in STAGES:  # (saved work read back: only a stage's own name is shown)
        return ""
    label = "temperature 0" if stage == "temperature" else STAGES[stage][0]
    return (f"<span class='tl-mark tl-removed' title='removed by the {html.escape(label, quote=True)} stage: "
            f"final probability 0'><span class='tl-long'>{html.escape(label)}</span>"
            f"<span class='tl-short'>{html.escape(label) if len(label) <= 6 else '✕'}</span></span>")


def masked_html(step: StepEvent) -> str:
    """The lines a constrained step's bars carry: the raw mass its constraint removed, and what
    it cost the distribution sampled from (cost_html)."""
    if step.masked_mass is None:
        return "<div class='tl-approx'>Constrained: the mass the constraint removed is not reported by the server.</div>"
    tagged = (" The candidates it forbids here are tagged “forbidden”." if any(c.forbidden for c in step.top) else "")
    return (f"<div class='tl-masked'>Constraint removed <b>{fmt_p(step.masked_mass)}</b> of the raw "
            f"probability at this step (masked mass).{tagged}</div>" + cost_html(step))


def fmt_kl(kl: float | None) -> str:
    """A KL divergence in nats as the page prints it: as a probability's digits (fmt_p), ∞ where
    the constrained distribution can draw a token the free one cannot."""
    if kl is None:
        return "–"
    return "∞" if math.isinf(kl) else fmt_p(max(kl, 0.0))  # (float64 rounding can leave -1e-17)


def cost_html(step: StepEvent) -> str:
    """What the constraint cost at this step (the engine's, computed from the logits the step
    sampled from; "" where not known, a server's): KL(constrained ‖ free) of the final
    distributions, the chosen token's p in the free one, and the free one's top tokens it removed."""
    if step.constraint_kl is None:
        return ""
    why = (" (it can draw a token the free distribution cannot)" if math.isinf(step.constraint_kl) else "")
    removed = removed_html(step)
    return (f"<div class='tl-masked tl-cost'>KL(constrained ‖ free) = <b>{fmt_kl(step.constraint_kl)}</b> nats{why}: "
            f"the free distribution is the same stages without the constraint, and gives the chosen token "
            f"p = {prob_html(step.free_prob)}.</div>"
            f"<div class='tl-masked tl-removed-top'>"
            + (f"Top tokens of the free distribution it removed: {removed}" if removed else
               "It removed none of the free distribution's top tokens.") + "</div>")


def piece_html(piece: str) -> str:
    """A token's label in a line of text (code: never marked as a term; no byte hint beneath it)."""
    return f"<code class='tl-piece'>{html.escape(token_label(piece))}</code>"


def removed_html(step: StepEvent) -> str:
    """The free distribution's top tokens a step's constraint removed, each with its free p."""
    return " · ".join(f"{piece_html(c.piece)}&nbsp;{prob_html(c.prob)}" for c in step.constraint_removed or [])


PICK_TITLE = " · click to continue the run from this token"


def bars_html(step: StepEvent | None, title: str = "", approx: str = "",
              bias: dict[int, float] | None = None, constrained: bool = False, pick: bool = False) -> str:
    """Horizontal bars: raw model probability and final sampling probability per candidate;
    `approx` says how approximate the numbers are, or where they come from (empty when they are
    the model's). A column the engine cannot give (in front of a server) says so in its header
    and shows dashes, never zeros. `bias` (token id -> logit bias) tags the candidates the
    run's logit bias moved or banned; under a constraint (`constrained`) the candidates it
    forbade are tagged and the mass it removed is given. pick: each candidate can be clicked
    (the run continues from it: ui/branches)."""
    if step is None:
        return "<div class='tl-bars tl-empty'>Generate to see each step's candidates.</div>"
    rows = []
    for c in step.top:
        chosen = c.id == step.token_id
        hint = byte_hint(c.piece)
        rows.append(
            f"<div class='tl-row{' tl-chosen' if chosen else ''}{' tl-pick' if pick else ''}'"
            + (f" data-pick='{step.step}:{c.id}' tabindex='0'" if pick else "") + ">"
            f"<span class='tl-tok{' tl-tok-bytes' if hint else ''}' title='id {c.id}{' · ' + html.escape(hint, quote=True) if hint else ''}"
            f"{PICK_TITLE if pick else ''}'>{'▶ ' if chosen else ''}{token_html(c.piece)}</span>"
            f"{_bar('tl-raw', c.raw_prob)}"
            f"{_bar('tl-final', c.prob, final_mark(c, bias))}</div>")
    missing = " (not given by the server)"
    # The heads name what the numbers are: "log p" while the page shows log-probabilities (words
    # switched as tl-p / tl-lp numbers are, in classes of their own: a number's class means a number).
    raw_head = ("raw model <span class='tl-p-word'>probability</span><span class='tl-lp-word'>log p</span>"
                + ("" if any(known(c.raw_prob) for c in step.top) else missing))
    final_head = ("final <span class='tl-lp-word'>log p </span>(sampled from)"
                  + ("" if any(known(c.prob) for c in step.top) else missing))
    rank = (f", rank {step.rank}" if step.rank is not None
            else ", rank not known (below the returned candidates)")
    head = gloss(f"<div class='tl-title'>{html.escape(title or f'Step {step.step}')}: chose "
            f"<b>{html.escape(token_label(step.piece))}</b>{byte_note(step.piece)} (id {step.token_id}) with "
            f"{chosen_prob_html(step.prob, step.raw_prob)}{rank}</div>"
            + (f"<div class='tl-approx'>{html.escape(approx)}</div>" if approx else "")
            + (masked_html(step) if constrained else "")
            + "<div class='tl-row tl-head'><span class='tl-tok'>token</span>"
            f"<span class='tl-h2 tl-h-raw'>{raw_head}</span>"
            f"<span class='tl-h2 tl-h-final'>{final_head}</span></div>")
    return f"<div class='tl-bars'>{head}{''.join(rows)}</div>"


def approx_note(info) -> str:
    """What the page says beside its numbers when decoding is not at the model's dtype."""
    r = info.decode_error
    if r is None:
        return ""
    return (f"Approximate: decode steps read {dtype_name(info.decode_dtype)} copies of the weights. "
            f"Measured at start-up against {dtype_name(info.dtype)} over {r.steps} steps: "
            f"probabilities differ by up to {r.max_prob_diff:.4f}; the most likely token agreed on "
            f"{100 * r.top1_agreement:.0f}% of steps. Start with --decode-dtype same for exact numbers.")


def step_axis() -> dict:
    """gr.LinePlot settings for a per-step x axis: from step 0, never below it (Vega-Lite pads a
    short domain into negative steps otherwise). Ticks stay Vega-Lite's: Gradio's LinePlot passes
    no tickMinStep, so with few steps they may still fall between whole steps."""
    return {"x": "step", "x_lim": [0, None]}


def line_frame(rows: list[dict], y: str, color: str | None = None) -> pd.DataFrame | None:
    """A per-step line chart's data (columns step, y and color), typed; None without a row: the
    chart is then not drawn until its data comes (an empty one made Vega warn "Infinite extent"
    at every update, and kept the colour scale it was first built with, empty: lines without a
    stroke), so its series have their colours from its first drawing."""
    if not rows:
        return None
    dtypes = {"step": "int64", y: "float64", **({color: "object"} if color else {})}
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def ended_markdown(done: DoneEvent, window: str, context: int, last_step=None) -> str:
    """Why the run ended, under its statistics (the local engine's and a server's alike)."""
    return (f"\nRun ended: **{reason_text(done, last_step)}**."
            + (f" Max new tokens was capped at {done.max_new_tokens} to fit {window} of {context}."
               if done.capped else ""))


def token_label(piece: str) -> str:
    """visible(piece), with every other character that would print as nothing (a control
    character, a non-breaking or zero-width space) written as its code point: ⟨U+000C⟩."""
    return "".join(ch if ch.isprintable() and not ch.isspace() or ch in "␣↵⇥" else f"⟨U+{ord(ch):04X}⟩"
                   for ch in visible(piece))


def token_html(piece: str) -> str:
    """A candidate's label as HTML: token_label; a piece holding bytes of a split character may
    break between its <0xNN> bytes (a narrow column shows them all) and says, under them, which
    bytes of a character they are ("1st of 3 bytes": byte_pieces.short_hint)."""
    label = html.escape(token_label(piece))
    hint = short_hint(piece)
    if not hint:
        return label
    return label.replace("&gt;&lt;", "&gt;<wbr>&lt;") + f"<span class='tl-byte-hint'>{html.escape(hint)}</span>"


def byte_note(piece: str) -> str:
    """" (1st byte of a 3-byte character)" after a piece holding bytes of a split character, else ""."""
    hint = byte_hint(piece)
    return f" <span class='tl-byte-note'>({html.escape(hint)})</span>" if hint else ""


# Which distribution a server's log-probabilities are (contract.Capabilities.logprobs).
LOGPROBS = {
    "raw": "the model's own distribution (vLLM's default --logprobs-mode raw_logprobs)",
    "processed": "the distribution after the sampling settings (--logprobs-mode processed_logprobs)",
}


NO_CONFIG = ("The served model's shapes are not known here: start the page with "
             "`--engine-config PATH` (its config.json, or a local copy of the model) for them and "
             "the KV-cache formula.")


def bars_note(info, top_n: int) -> str:
    """The line under each step's bars: where its numbers come from, or how approximate they are."""
    if not info.capabilities.whole_distribution:
        return (f"From the server's log-probabilities of its top {top_n} candidates: "
                f"{LOGPROBS[info.capabilities.logprobs]}.")
    return approx_note(info)


# Where an engine lacks a capability (contract.Capabilities), a section says why in its place.
NOT_HERE = "not available when the page is in front of a server"
