"""The branch tree's events: a candidate clicked in the bars starts a branch (the run continues
from it as token ids, with the run's settings and seed); a run's end adds it to the tree; a
branch clicked in the tree is put on view. The tree's data is ui/shared/tree.py (the edit panel
and the saved work grow it too)."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import gradio as gr

from inference.errors import TokenLabError, shown
from ui.base import Section, step_index
from ui.controls import NAMES
from ui.run_state import RunRecord
from ui.shared.conversation import conversation_html
from ui.shared.tree import MAX_BRANCHES, node, tree_html

def branch_controls(rec: RunRecord, step: int, chosen: int):
    """The controls of a branch of an ended run at its `step`, taking candidate `chosen`: the run's
    own (its model, settings and seed), continuing after the prompt, the tokens before that step and
    the candidate, as token ids; max new tokens stays the run's (the tokens the branch makes after
    them). Also the step's index and the candidate. A page error for a candidate not there."""
    i = step_index(rec, step)
    cand = next((c for c in rec.steps[i].top if c.id == chosen), None)
    if cand is None:
        raise gr.Error(f"Token {chosen} is not among step {i}'s candidates.", print_exception=False)
    prefix = rec.generated_before(i) + [chosen]
    return replace(rec.controls, prefix_ids=",".join(map(str, prefix)), seed=str(rec.seed)), i, cand


class BranchHandlers(Section):
    def branch(self, rec: RunRecord | None, nodes, evt: gr.SelectData) -> dict:
        """A candidate clicked in the bars (evt.value: "step:token id"): the controls are set to
        the branch's (branch_controls). The run then starts as for Generate (ui/run's chain), and
        its end adds it to the tree."""
        if rec is None or rec.done is None or rec.controls is None or not rec.steps:
            raise gr.Error("Let the run end, then click a candidate to continue from it.", print_exception=False)
        try:
            step, chosen = (int(x) for x in str(evt.value).split(":"))
        except (TypeError, ValueError, AttributeError):
            raise gr.Error("No candidate was clicked.", print_exception=False) from None
        c, i, cand = branch_controls(rec, step, chosen)
        nodes = list(nodes or [])
        parent = next((k for k, n in enumerate(nodes) if n["record"] is rec), None)
        if parent is None:  # the run on view is not in the tree: it starts one
            nodes, parent = [node(rec, prefix=rec.given)], 0
        if len(nodes) >= MAX_BRANCHES:
            raise gr.Error(f"At most {MAX_BRANCHES} branches are kept: Generate starts a new tree.",
                           print_exception=False)
        nodes.append(node(None, parent, len(rec.given) + i, cand, rec.generated_before(i) + [chosen]))
        # In chat mode the branch continues the same turn: the conversation before it.
        return {**dict(zip(NAMES, c.values())), "branches": nodes, "history": list(rec.history),
                "conversation": conversation_html(list(rec.history))}

    def leave_branch(self, prefix_ids):
        """A prompt, system prompt, mode or model chosen by hand: the given ids of a branch (or
        an edit) belonged to the run before, so the next run starts from the prompt alone."""
        return "" if str(prefix_ids or "").strip() else gr.skip()

    def branch_run(self, rec: RunRecord | None, step, token_id, request: gr.Request = None) -> Iterator[dict]:
        """/branch for scripts: this session's last run (of /generate) continued from candidate
        `token_id` of `step`, as a click on it in the bars: the same settings and seed, the
        tokens before that step and the candidate as given ids; the same checks as /generate."""
        if rec is None or rec.done is None:
            raise gr.Error("There is no run to branch from: call /generate first (in the same session).",
                           print_exception=False)
        if not all((isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
                   for v in (step, token_id)):  # (NaN, infinity and 10**400 too)
            raise gr.Error(f"step and token id must be whole numbers, got {shown(step)} and {shown(token_id)}",
                           print_exception=False)
        if not 0 <= step < len(rec.steps):
            raise gr.Error(f"step must be from 0 to {len(rec.steps) - 1} (the run's steps), got {int(step)}",
                           print_exception=False)
        c, _, _ = branch_controls(rec, int(step), int(token_id))
        try:
            branch = self.runs.prepare(c, None, list(rec.history))  # the same checks as /generate's
        except TokenLabError as e:
            raise gr.Error(str(e), print_exception=False) from None
        yield from self.runs.stream(branch, request)

    def grow_tree(self, rec: RunRecord | None, nodes) -> dict:
        """After a run: a branch that was waiting for it gets it; any other run starts a new
        tree. A branch whose run did not start is dropped."""
        nodes = [n for n in (nodes or []) if n["record"] is not None or (rec is not None and n["prefix"] == rec.given)]
        if rec is None or rec.done is None:
            nodes = [n for n in nodes if n["record"] is not None]
            return {"branches": nodes, "branch_view": tree_html(nodes, None)}
        waiting = next((k for k, n in enumerate(nodes) if n["record"] is None), None)
        if waiting is None:
            nodes, waiting = [node(rec, prefix=rec.given)], 0
        else:
            nodes[waiting]["record"] = rec
        return {"branches": nodes, "branch_view": tree_html(nodes, waiting)}

    def view_branch(self, nodes, evt: gr.SelectData) -> dict:
        """A branch clicked in the tree: its run on view (text, bars, statistics, charts) and
        the controls set to it, so that a link made now restores this branch."""
        nodes = list(nodes or [])
        try:
            k = int(evt.value)
            rec = nodes[k]["record"]
        except (TypeError, ValueError, AttributeError, IndexError):
            return {}
        if rec is None:
            return {}
        return {**self.runs.show(rec), "branch_view": tree_html(nodes, k)}
