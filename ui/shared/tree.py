"""The branch tree, which the branches, the edit panel and the saved work all grow or show: a
node per run (where it split from its parent, the token taken there, its run) and the tree as
HTML, each branch under its parent with the token taken and its probability. Pure functions."""

from __future__ import annotations

import html

from ui.format import fmt_p, visible
from ui.run_state import RunRecord

# Branches a tab keeps at once (each holds its run's record); a new run starts a new tree.
MAX_BRANCHES = 16


def node(rec: RunRecord, parent: int | None = None, at: int = 0, cand=None, prefix=()) -> dict:
    """One branch: where it split from its parent (the step and the candidate taken there) and
    its run (None while it runs)."""
    return {"parent": parent, "at": at, "token": cand.id if cand else None, "piece": cand.piece if cand else "",
            "raw": cand.raw_prob if cand else None, "final": cand.prob if cand else None,
            "prefix": list(prefix), "record": rec}


BRANCH_HINT = ("Click a candidate in the bars to continue the run from it (the same settings and seed, "
               "the tokens before it as given ids). Each branch is listed here; click one to view it.")


def tree_html(nodes: list[dict], viewing: int | None) -> str:
    """The branches, each under its parent, the one on view marked."""
    if not nodes:
        return f"<div class='tl-branches tl-empty'>{html.escape(BRANCH_HINT)}</div>"
    children: dict[int | None, list[int]] = {}
    for i, n in enumerate(nodes):
        children.setdefault(n["parent"], []).append(i)
    rows = []

    def walk(i: int, depth: int) -> None:
        n = nodes[i]
        rec = n["record"]
        # A character the run's end cut off is said so, as the output says it (never as U+FFFD).
        text = "(running…)" if rec is None else rec.answer_text + (f"[cut off: {rec.cut_off}]" if rec.cut_off else "")
        if n["parent"] is None:
            where = "the run"
        else:
            # The step as its parent's step slider numbers it (from the parent's first token made,
            # after any it was given); where that is not the answer's start, the answer's count too.
            at, given = n["at"], len(nodes[n["parent"]]["prefix"])
            answer = f" (after {at} tokens of the answer)" if given else ""
            piece = visible(n["piece"] if len(n["piece"]) <= 24 else n["piece"][:24] + "…")
            where = (f"step {at - given}{answer}: edited to <b>{html.escape(piece)}</b>" if n["token"] is None else
                     f"step {at - given}{answer}: <b>{html.escape(piece)}</b> "
                     f"(raw p {fmt_p(n['raw'])}, final p {fmt_p(n['final'])})")
        short = text if len(text) <= 80 else text[:80] + "…"
        rows.append(f"<div class='tl-branch{' tl-viewing' if i == viewing else ''}' data-pick='{i}' tabindex='0' title='{html.escape(text, quote=True)}' "
                    f"style='margin-left:{1.2 * depth:.1f}em'>{'↳ ' if depth else ''}{where} · "
                    f"<span class='tl-branch-text'>{html.escape(short)}</span></div>")
        for c in children.get(i, []):
            walk(c, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)
    return f"<div class='tl-branches'><div class='tl-hint'>{html.escape(BRANCH_HINT)}</div>{''.join(rows)}</div>"
