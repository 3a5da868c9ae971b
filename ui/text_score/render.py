"""What the "probability of a text" panel shows: every token coloured by its probability given the
text before it, its rank and surprisal on hover or tap, the tokens the model preferred on a click
(and, under the text, the choices to run from there), and the text's perplexity. Pure functions
of the engine's TokenScores, no Gradio."""

from __future__ import annotations

import html
import math

from inference.events import TokenScore, perplexity
from ui.format import BUCKETS, bucket_class, fmt_p, piece_html, prob_html, token_html, token_label
from ui.glossary import gloss

TOP = 10  # the alternatives a click on a token lists


def _shown(text: str) -> str:
    return html.escape(text).replace("\n", "↵\n") or "∅"


def _numbers(s: TokenScore) -> str:
    if s.logprob is None:
        return f"id {s.id} · nothing before it: no probability"
    rank = "rank –" if s.rank is None else f"rank {s.rank}" + (" (the model's top choice)" if s.rank == 1 else "")
    return f"id {s.id} · p {prob_html(s.prob)} · {rank} · surprisal {s.surprisal_bits:.2f} bits"


def _popover(group: list[TokenScore]) -> str:
    """A chip's numbers (each of its tokens': byte tokens of one character are one chip), and the
    tokens the model preferred at its first token, shown on a click."""
    heads = "".join(f"<span class='tl-pop-head'>{html.escape(token_label(s.piece)) + ': ' if len(group) > 1 else ''}"
                    f"{_numbers(s)}</span>" for s in group)
    first, alts = group[0], ""
    if first.top:
        listed = "".join(f"<span class='tl-alt{' tl-alt-chosen' if c.id == first.id else ''}'>"
                         f"<span>{html.escape(token_label(c.piece))}</span><span>{prob_html(c.raw_prob)}</span></span>"
                         for c in first.top[:TOP])
        alts = (f"<span class='tl-more'><span class='tl-pop-head'>the model's top {len(first.top[:TOP])} here:</span>"
                f"{listed}</span><span class='tl-more-hint'>click for the tokens the model preferred</span>")
    return f"<span class='tl-pop' role='tooltip'>{heads}{alts}</span>"


def scored_html(scores: list[TokenScore], tokenizer=None) -> str:
    """The text, one chip per token (byte tokens that make one character together: one chip, of
    the product of their probabilities) coloured by its probability (uncoloured: none), each
    with its popover."""
    if not scores:
        return "<div class='tl-out tl-empty'>Score a text to see it here.</div>"
    ids = [s.id for s in scores]
    groups = tokenizer.char_groups(ids) if tokenizer is not None else [(range(i, i + 1), True) for i in range(len(ids))]
    chips = []
    for positions, _ in groups:
        group = [scores[i] for i in positions]
        text = group[0].piece if len(group) == 1 else tokenizer.decode([s.id for s in group])
        probs = [s.prob for s in group]
        prob = None if None in probs else math.prod(probs)
        # data-i: the chip's first token, in scores (a click selects it: the choices to run from there)
        chips.append(f"<span class='tl-t {bucket_class(prob)}' tabindex='0' data-i='{positions.start}'>"
                     f"{_shown(text)}{_popover(group)}</span>")
    legend = ("<div class='tl-legend'>colour = probability given the text before it: "
              + "".join(f"<span class='tl-key {bucket_class(t)}'>{html.escape(name)}</span>" for t, name in BUCKETS)
              + "<span class='tl-key tl-bu'>no text before it</span></div>")
    return f"<div class='tl-out tl-score'>{''.join(chips)}</div>{legend}"


def summary_md(scores: list[TokenScore], before: list[TokenScore], what: str) -> str:
    """The text's perplexity and token counts; `before` the tokens fed ahead of it (a BOS)."""
    known = [s for s in scores if s.logprob is not None]
    ppl = perplexity(scores)
    lines = [f"**{what}**: {len(scores)} token{'s' if len(scores) != 1 else ''}"
             + (f", read after {' '.join(html.escape(token_label(s.piece)) for s in before)} (the token the model adds first)" if before else "")
             + "."]
    if ppl is None:
        lines.append("No token has a text before it: there is nothing to score. Add more text.")
        return "\n\n".join(lines)
    bits = sum(s.surprisal_bits for s in known)
    least = min(known, key=lambda s: s.logprob)
    lines.append(f"**Perplexity {ppl:.3f}** over the {len(known)} token{'s' if len(known) != 1 else ''} with a text "
                 f"before {'them' if len(known) != 1 else 'it'} (mean surprisal {bits / len(known):.2f} bits, "
                 f"{bits:.1f} bits in all). Least likely: `{token_label(least.piece)}` (p {fmt_p(least.prob)}, "
                 f"rank {least.rank if least.rank is not None else '–'}).")
    if len(known) < len(scores):
        lines.append("The first token has nothing before it: it is not coloured and does not count.")
    return "\n\n".join(lines)


def refused(message: str) -> dict:
    """Nothing scored: the reason in one line where the summary goes, no scores (an earlier
    text's would read as this one's)."""
    return {"score_md": "⚠ " + " ".join(message.split()), "score_view": scored_html([]), "score_data": None}


def scores_json(scores: list[TokenScore], before: int) -> dict:
    """The API's structured answer, the CLI's lines and summary."""
    ppl = perplexity(scores)
    return {"tokens": [s.to_json() for s in scores], "perplexity": ppl, "bos": bool(before),
            "scored": sum(s.logprob is not None for s in scores)}


# Under a scored text, before a token is clicked.
BRANCH_HINT = ("<div class='tl-from-text tl-hint'>Click a token to start a run from it: the text before it as the "
               "prompt, or one of the model's candidates put in its place.</div>")


def branch_html(scores: list[TokenScore], i: int, before: int) -> str:
    """The choices a click on token i of the scored text opens: a run from there (the tokens
    before it, as scored, its prompt), or with one of the model's candidates there put in its
    place. Each a [data-pick] (assets/pick.js) "at:" or "at:id", `at` the token's place in the
    ids as scored (the `before` tokens fed ahead of the text counted). The words around the
    choices are marked with the glossary's definitions, the choices' own are not (a tap on a
    term would also start the run)."""
    if not 0 <= i < len(scores):
        return BRANCH_HINT
    s, at = scores[i], before + i
    head = f"Token {i + 1} of the text, {piece_html(s.piece)}"
    if at == 0 or s.logprob is None:
        return gloss(f"<div class='tl-from-text'><div class='tl-title'>{head}: nothing is before it to run from; "
                     "click a later token.</div></div>")
    rank = "" if s.rank is None else f", rank {s.rank}"
    n = len(s.top[:TOP])
    title = gloss(f"<div class='tl-title'>{head} (p {prob_html(s.prob)}{rank})</div>")
    here = gloss(f"<span class='tl-hint'>the {at:,} token{'s' if at != 1 else ''} before it, as scored, are the "
                 "prompt</span>")
    also = gloss(f"<div class='tl-hint'>or put one of the model's top {n} here in its place, and the run continues "
                 "after it:</div>")
    rows = "".join(
        f"<div class='tl-pick tl-cand{' tl-alt-chosen' if c.id == s.id else ''}' role='button' tabindex='0' "
        f"data-pick='{at}:{c.id}' title='id {c.id} · run with this token in its place'>"
        f"<span class='tl-tok'>{token_html(c.piece)}</span><span class='tl-num'>{prob_html(c.raw_prob)}</span>"
        f"<span class='tl-cand-note'>{'the text’s own' if c.id == s.id else ''}</span></div>" for c in s.top[:TOP])
    return (f"<div class='tl-from-text'>{title}<div class='tl-from-row'><span class='tl-pick tl-from-here' "
            f"role='button' tabindex='0' data-pick='{at}:'>▶ Run from here</span> {here}</div>{also}"
            f"<div class='tl-cands'>{rows}</div></div>")
