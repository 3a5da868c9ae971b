"""The branch tree's events: a candidate clicked in the bars starts a branch (the run continues
from it as token ids, with the run's settings and seed); a run's end adds it to the tree; a
branch clicked in the tree is put on view."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Iterator

import gradio as gr

from inference.errors import shown
from ui.base import PageContext, Section, step_index
from ui.branches.render import tree_html
from ui.chat import conversation_html
from ui.controls import NAMES
from ui.run import render as run_render
from ui.run_state import RunRecord

if TYPE_CHECKING:
    from ui.run.handlers import RunHandlers

# Branches a tab keeps at once (each holds its run's record); a new run starts a new tree.
MAX_BRANCHES = 16


def node(rec: RunRecord, parent: int | None = None, at: int = 0, cand=None, prefix=()) -> dict:
    """One branch: where it split from its parent (the step and the candidate taken there) and
    its run (None while it runs)."""
    return {"parent": parent, "at": at, "token": cand.id if cand else None, "piece": cand.piece if cand else "",
            "raw": cand.raw_prob if cand else None, "final": cand.prob if cand else None,
            "prefix": list(prefix), "record": rec}


class BranchHandlers(Section):
    def __init__(self, page: PageContext, run: "RunHandlers"):
        super().__init__(page)
        self.run = run

    def branch(self, rec: RunRecord | None, nodes, evt: gr.SelectData) -> dict:
        """A candidate clicked in the bars (evt.value: "step:token id"): the controls are set to
        the run's own (its model, settings and seed), continuing after the prompt, the tokens
        before that step and the candidate, as token ids; max new tokens stays as it was (the
        tokens the branch makes after them). The run then starts as for Generate (ui/run's
        chain), and its end adds it to the tree."""
        if rec is None or rec.done is None or rec.controls is None or not rec.steps:
            raise gr.Error("Let the run end, then click a candidate to continue from it.", print_exception=False)
        try:
            step, chosen = (int(x) for x in str(evt.value).split(":"))
        except (TypeError, ValueError, AttributeError):
            raise gr.Error("No candidate was clicked.", print_exception=False) from None
        i = step_index(rec, step)
        cand = next((c for c in rec.steps[i].top if c.id == chosen), None)
        if cand is None:
            raise gr.Error(f"Token {chosen} is not among step {i}'s candidates.", print_exception=False)
        nodes = list(nodes or [])
        parent = next((k for k, n in enumerate(nodes) if n["record"] is rec), None)
        if parent is None:  # the run on view is not in the tree: it starts one
            nodes, parent = [node(rec, prefix=rec.given)], 0
        if len(nodes) >= MAX_BRANCHES:
            raise gr.Error(f"At most {MAX_BRANCHES} branches are kept: Generate starts a new tree.",
                           print_exception=False)
        prefix = rec.generated_before(i) + [chosen]
        c = replace(rec.controls, prefix_ids=",".join(map(str, prefix)), seed=str(rec.seed))
        nodes.append(node(None, parent, len(rec.given) + i, cand, prefix))
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
        out = self.branch(rec, [], SimpleNamespace(value=f"{int(step)}:{int(token_id)}"))
        yield from self.run.generate(*[out[n] for n in NAMES], request, list(rec.history))

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
        return {**self.show_run(rec), "branch_view": tree_html(nodes, k)}

    def show_run(self, rec: RunRecord) -> dict:
        """An ended run put on view again (text, bars, statistics, charts, tokens, downloads) and
        the controls set to it, so that a link made now restores it (SHOWN's names, less the tree)."""
        n = len(rec.steps)
        out = {name: v for name, v in self.run.outputs(rec).items() if name != "api_tokens"}
        out.update(self.run.drawn(rec))
        out.update({"step": gr.update(minimum=0, maximum=max(n - 1, 1), value=max(n - 1, 0), interactive=n > 1),
                    "prompt_view": gr.update(value=run_render.fed_text(self.view(rec.model).tokenizer, rec), visible=True),
                    **({} if rec.controls is None else dict(zip(NAMES, rec.controls.values()))),
                    "seed": str(rec.seed)})
        return out
