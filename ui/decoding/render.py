"""The decoding section's HTML: a beam search's tree, step by step, and a speculative run's
proposals, accepts and rejects, token by token."""

from __future__ import annotations

import html

from inference.decoding.beams import UNSCORED, unscored_message
from inference.decoding.drafters import same_ids
from ui.format import count, token_label

STATUS = {"kept": "kept", "finished": "finished", "pruned": "pruned"}


def _piece(piece: str) -> str:
    return html.escape(token_label(piece))


def beam_tree_html(steps: list, done) -> str:
    """Columns of steps; in each, every continuation considered, best first: the beam it extends
    (b0…), its token and its cumulative log-probability; kept ones say which beam they become,
    pruned ones are greyed, finished ones framed. Then the finished beams, ranked."""
    if not steps:
        return ""
    cols = []
    for s in steps:
        cells = []
        for h, piece in zip(s.hypotheses, s.pieces):
            to = f" → b{h.beam}" if h.status == "kept" else (" ✓" if h.status == "finished" else "")
            cells.append(f'<div class="hyp {STATUS[h.status]}" title="token {h.token_id}, log p {h.logprob:.4f}, '
                         f'{h.status}"><span class="from">b{h.parent}</span> <b>{_piece(piece)}</b>'
                         f'<span class="to">{to}</span><br><span class="lp">{h.cumulative:.3f}</span></div>')
        shared = f"{s.kv_blocks} KV blocks ({s.kv_blocks_unshared} unshared)"
        cols.append(f'<div class="beam-step"><div class="head">step {s.step}<br><small>{shared}</small></div>'
                    + "".join(cells) + "</div>")
    ranked = "".join(
        f"<tr><td>{i + 1}</td><td>{b.score:.4f}</td><td>{b.logprob:.4f}</td><td>{len(b.tokens)}</td>"
        f"<td class='text'>{html.escape(text) or '<i>(empty)</i>'}</td></tr>"
        for i, (b, text) in enumerate(zip(done.beams, done.texts)))
    return (f'<div class="beam-tree" id="beam-tree">{"".join(cols)}</div>'
            f'<table class="beams-ranked"><tr><th>rank</th><th>score</th><th>log p</th><th>tokens</th>'
            f'<th>text</th></tr>{ranked}</table>')


def beam_choices(done, chars: int = 48) -> list[tuple[str, int]]:
    """The finished beams as the "Open as a run" list: rank, score and the start of the text."""
    def short(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= chars else text[:chars - 1] + "…"
    return [(f"{i + 1}. score {b.score:.4f}: {short(t)}", i) for i, (b, t) in enumerate(zip(done.beams, done.texts))]


def beam_summary_md(done) -> str:
    best = done.beams[0] if done.beams else None
    if done.reason == UNSCORED:
        return f"⚠ The {unscored_message(done.length_penalty).removeprefix('the ')}."
    if best is None:
        return f"Beam search ended ({done.reason}) with no finished beam."
    return (f"**Beam search**, {done.num_beams} beams, length penalty {done.length_penalty:g}: {count(done.steps, 'step')}, "
            f"ended by {'the token cap' if done.reason == 'length' else done.reason}. Best beam: score "
            f"{best.score:.4f} = log p {best.logprob:.4f} / {len(best.tokens)}^{done.length_penalty:g}. "
            "Each column is a step: `b0 'token' −3.2` extends beam 0 by the token, −3.2 the sequence's "
            "log-probability; kept continuations become the next step's beams (→ b1), pruned ones are grey, "
            "finished ones framed.")


def spec_table_html(steps: list) -> str:
    """One row per token: its round, the proposal there, accepted or rejected with the coin and
    the probabilities, the token emitted and its probability."""
    if not steps:
        return ""
    rows = []
    for s in steps:
        if s.proposed is None:
            how, cls = "drawn from p (no proposal left)", "bonus"
        elif s.accepted:
            how, cls = "accepted", "accepted"
        else:
            how, cls = "rejected → drawn from (p − q)⁺", "rejected"
        coin = "" if s.coin is None else f"{s.coin:.3f}"
        ratio = "" if s.target_prob is None else f"{min(1.0, s.target_prob / s.draft_prob) if s.draft_prob else 0:.3f}"
        rows.append(f"<tr class='{cls}'><td>{s.step}</td><td>{s.round}</td>"
                    f"<td>{'' if s.proposed_piece is None else _piece(s.proposed_piece)}</td>"
                    f"<td>{'' if s.target_prob is None else f'{s.target_prob:.4f}'}</td>"
                    f"<td>{'' if s.draft_prob is None else f'{s.draft_prob:.4f}'}</td><td>{ratio}</td><td>{coin}</td>"
                    f"<td>{how}</td><td><b>{_piece(s.piece)}</b></td><td>{s.prob:.4f}</td></tr>")
    return ("<table class='spec-steps' id='spec-steps'><tr><th>step</th><th>round</th><th>proposed</th><th>p</th>"
            "<th>q</th><th>min(1, p/q)</th><th>coin u</th><th>decision</th><th>token</th><th>its p</th></tr>"
            + "".join(rows) + "</table>")


def spec_summary_md(done, rate: float | None, plain_rate: float | None, same: bool | None) -> str:
    """The run's decisions and its measured speed against plain decoding of the same request."""
    accepted = "" if done.acceptance_rate is None else f" ({done.acceptance_rate:.0%})"
    if rate is None:
        speed = "too few tokens to time."
    elif plain_rate is None:
        speed = f"{rate:.1f} tokens/s on this machine."
    else:
        speed = (f"{rate:.1f} tokens/s on this machine against {plain_rate:.1f} for plain decoding of the same "
                 f"request, run just after: **{rate / plain_rate:.2f}×**."
                 + ("" if same is None else " Its text is plain greedy decoding's, token for token." if same
                    else " ⚠ Its text differs from plain greedy decoding's."))
    return (f"**Speculative decoding** with {done.drafter}, {count(done.draft_tokens, 'proposal')} a round: "
            f"{count(done.generated_tokens, 'token')} in {count(done.rounds, 'target pass', 'target passes')} "
            f"({done.generated_tokens / done.rounds if done.rounds else 0:.2f} a pass), {done.accepted} of "
            f"{done.proposed} proposals accepted{accepted}; {speed} A proposal is "
            "accepted when the coin u < min(1, p/q); at a rejection the token is drawn from (p − q)⁺, so the "
            "text's distribution is the model's own.")


DRAFTERS = (("prompt lookup: n-grams of the context", "prompt-lookup"),
            ("early exit: this model's first layers", "early-exit"))


DRAFTER_INFO = "draft models: the page's other models with this one's tokenizer (a drafter's ids must be the target's)"


def drafters(models, target: str | None) -> tuple[list[tuple[str, str]], str | None]:
    """The drafter choices for the target model (a label, "" the default) and the line under them:
    prompt lookup, the early exit and each other model the page has loaded whose ids are the
    target's; the line says why each other model is not offered (another tokenizer; not loaded yet,
    so its tokenizer is not known). None: a page of one model, with no draft model to speak of."""
    if len(models.labels) < 2:
        return list(DRAFTERS), None
    target = models.label_of(target)
    offered, absent = [], {}
    for label in models.labels:
        if label == target:
            continue
        if not (models.loaded(label) and models.loaded(target)):
            absent.setdefault("not loaded yet, so its tokenizer is not known (pick it once in Model)", []).append(label)
        elif same_ids(models.engine(label), models.engine(target)):
            offered.append((f"draft model: {label}", f"model:{label}"))
        else:
            absent.setdefault("another tokenizer", []).append(label)
    why = "; ".join(f"{', '.join(labels)}: {reason}" for reason, labels in absent.items())
    return [*DRAFTERS, *offered], DRAFTER_INFO + (f". Not offered: {why}" if why else "")
