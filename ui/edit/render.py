"""What the edit panel shows: where the edited text's tokens differ from the run's, the tokens
of text the edit did not touch marked. Pure functions, no Gradio."""

from __future__ import annotations

import html

from ui.edit.seam import Change
from ui.format import visible

EDIT_HINT = ("Edit the output, then continue the run from your text: the prompt's token ids, then your text "
             "tokenized after the prompt, with the run's settings and seed. Undo goes back to the run before.")


def _tokens(tokens: list[tuple[int, str]]) -> str:
    if not tokens:
        return "<span class='tl-none'>(none)</span>"
    return "".join(f"<span class='tl-tk'>{html.escape(visible(p))}<sub>{i}</sub></span>" for i, p in tokens)


# The table's lead and columns: as you type (your text against the run on view), and once a
# continue from an edit has run (the box then holds the new run's text: the table says how that
# run began, against the run it edited).
TYPING = ("<div class='tl-seam-lead'><b>Your text against the run on view</b>, as you type: where its tokens "
          "differ from the run's.</div>", "the run's tokens", "your text's tokens")
CONTINUED = ("<div class='tl-seam-lead'><b>This run continued from your edit of the run before it</b> (Undo "
             "goes back to that run): where your edit's tokens differ from that run's.</div>",
             "the edited run's tokens", "your edit's tokens")


def seam_html(changes: list[Change] | None, error: str = "", continued: bool = False) -> str:
    """The places where the tokens differ (the run's | the edited text's), and whether the edit
    changed the tokens of text it did not touch; `continued`: labelled as the edit the run on
    view continued from, against the run it edited."""
    lead, before, after = CONTINUED if continued else TYPING
    if error:
        return f"<div class='tl-seam tl-empty'>{html.escape(error)}</div>"
    if changes is None:
        return ""
    if not changes:
        return f"<div class='tl-seam tl-empty'>{lead}Unedited: your text has the run's own tokens.</div>"
    moved = sum(c.retokenized for c in changes if c.seam)
    away = sum(1 for c in changes if not c.near)
    are = "are" if moved != 1 else "is"
    head = (f"<b>Your edit changed how the text around it tokenizes:</b> {moved} token{'s' * (moved != 1)} of "
            f"text you did not edit {are} different now (marked ⚑). The model reads the new tokens."
            if moved else "The text around your edit tokenizes as before: only the edited tokens differ.")
    if away:
        head += (f" Away from the edit, in {away} place{'s' * (away != 1)} (marked ≠), the run's own tokens are "
                 "not how the tokenizer writes the same text: a model may spell a text in tokens the tokenizer "
                 "never would, and the continuation reads the tokenizer's.")
    rows = "".join(f"<tr class='{'tl-seam-moved' if c.seam else '' if c.near else 'tl-seam-away'}'>"
                   f"<td>{'⚑' if c.seam else '' if c.near else '≠'}</td>"
                   f"<td>{_tokens(c.before)}</td><td>{_tokens(c.after)}</td></tr>" for c in changes)
    return (f"<div class='tl-seam'>{lead}<div class='tl-seam-head'>{head}</div><table class='tl-seam-table'>"
            f"<thead><tr><th></th><th>{before}</th><th>{after}</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")
