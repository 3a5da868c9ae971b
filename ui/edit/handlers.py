"""The edit panel's events: the run's text into the box after a run, the seam shown as you type,
a continue from the edited text (as token ids, through the run section's chain of events), undo;
and /continue_edit for scripts."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import gradio as gr

from inference.errors import InputError, TokenLabError
from ui.base import Section, page_error, takes_controls
from ui.controls import NAMES, Controls
from ui.edit.render import seam_html
from ui.edit.seam import edited_ids, seam_changes
from ui.run_state import RunRecord
from ui.shared.conversation import conversation_html
from ui.shared.tree import MAX_BRANCHES, node, tree_html

# Runs an undo goes back through (each holds its run's record).
MAX_UNDO = 16


def output_ids(rec: RunRecord, tokenizer) -> list[int]:
    """The ids of a run's text after its prompt (its given ones, then those generated), less an
    end-of-sequence token that ended it: the text the edit box holds."""
    ids = rec.generated_before(len(rec.steps))
    if rec.done is not None and rec.done.reason == "eos" and ids and tokenizer.is_control(ids[-1]):
        ids = ids[:-1]
    return ids


def edit_branch(nodes: list[dict], rec: RunRecord, ids: list[int], tokenizer) -> list[dict]:
    """The branch tree with the continuation of an edit waiting in it: a branch of the run
    edited, at the first token where the edited text's ids leave the run's (its run joins it
    at its end: ui/branches' grow_tree). A full tree is left as it is: the continuation then
    starts a new one, as a run does."""
    parent = next((k for k, n in enumerate(nodes) if n["record"] is rec), None)
    if parent is None:  # the run on view is not in the tree: it starts one
        nodes, parent = [node(rec, prefix=rec.given)], 0
    if len(nodes) >= MAX_BRANCHES:
        return nodes
    ran = output_ids(rec, tokenizer)
    at = next((k for k, (a, b) in enumerate(zip(ran, ids)) if a != b), min(len(ran), len(ids)))
    # No candidate was taken there: the text the edit put from that token on (token None).
    edit = {**node(None, parent, at, prefix=ids), "piece": tokenizer.decode(ids[at:], unfinished="") or "(cut)"}
    return [*nodes, edit]


class EditHandlers(Section):
    def _edit(self, c: Controls, edited, history=None) -> tuple[Controls, RunRecord, list[int]]:
        """The controls that continue after the edited text (prefix_ids: its ids after the
        prompt's), the prepared run and those ids; InputError in one line for what no run could use."""
        if not isinstance(edited, str):
            raise InputError("the edited text must be text")
        if not edited:
            raise InputError("the edited text is empty: Generate continues from the prompt itself")
        if str(c.prefix_ids or "").strip():
            raise InputError("give the edited text or prefix ids, not both: the edited text is all that follows the prompt")
        rec = self.runs.prepare(c, 0, history)  # the checks of a run: settings, prompt, model
        m = self.view(rec.model)
        room = m.context - 1 - len(rec.prompt_ids)
        if hasattr(m.engine, "check_fits"):  # refused by its length before any tokenizing
            m.engine.check_fits("the edited text is", len(edited), room,
                                f"the context window has {max(room, 0):,} after the prompt's {len(rec.prompt_ids):,}")
        ids = edited_ids(m.tokenizer, rec.prompt_text, rec.prompt_ids, edited, c.mode == "chat")
        if len(rec.prompt_ids) + len(ids) >= m.context:
            raise InputError(f"the prompt and the edited text are {len(rec.prompt_ids) + len(ids):,} tokens but "
                             f"the context window is {m.context:,}: shorten the text")
        return replace(c, prefix_ids=",".join(map(str, ids))), rec, ids

    def edit_preview(self, rec: RunRecord | None, edited, undo=None) -> str:
        """The seam table for the box as it is: where the edited text's tokens differ from the
        run's as you type; with the run's own text in the box, what the edit it continued from
        changed (if it did), else nothing. A function of the run, the box and the undo stack
        only, so every event that changes one of them shows the same table whichever comes
        last. Outside the queue: never raises, says what is wrong instead."""
        if rec is None or rec.done is None or rec.controls is None:
            return seam_html(None, "Let a run end: its text comes here to edit.")
        if edited == rec.answer_text:
            last = undo[-1] if undo else None
            return seam_html(last["changes"], continued=True) if last and last["continued"] is rec else ""
        try:
            _, _, ids = self._edit(replace(rec.controls, prefix_ids=""), edited, rec.history)
        except TokenLabError as e:
            return seam_html(None, f"Cannot continue from this text: {e}")
        tok = self.view(rec.model).tokenizer
        return seam_html(seam_changes(tok, output_ids(rec, tok), ids))

    def edit_continue(self, rec: RunRecord | None, edited, nodes=None, history=None) -> dict:
        """Continue from the edited text: the controls set to the run's (its model, settings,
        seed, in chat mode its earlier turns) with prefix_ids the edited text's ids; the run
        then starts as for Generate (ui/run's chain). What was on view, and where the edit's
        tokens differ from it, are kept for undo and the seam table once the continuation has
        run (edit_after_run)."""
        if rec is None or rec.done is None or rec.controls is None:
            raise gr.Error("Let the run end, then edit its text and continue.", print_exception=False)
        try:
            c, _, ids = self._edit(replace(rec.controls, prefix_ids="", seed=str(rec.seed)), edited, rec.history)
        except TokenLabError as e:
            raise page_error(e) from None
        tok = self.view(rec.model).tokenizer
        changes = seam_changes(tok, output_ids(rec, tok), ids)
        before = {"record": rec, "branches": list(nodes or []), "history": list(history or [])}
        return {**dict(zip(NAMES, c.values())), "history": list(rec.history),
                "branches": edit_branch(list(nodes or []), rec, ids, tok),
                "edit_pending": {"ids": ids, "before": before, "changes": changes},
                "edit_seam": seam_html(changes, continued=True)}

    def edit_after_run(self, rec: RunRecord | None, pending=None, undo=None) -> dict:
        """After any run: its text in the box. A continuation of an edit keeps what was on view
        before it for undo (at most MAX_UNDO back), and the seam table says what the edit
        changed in that run's tokens; any other run starts afresh (no undo, no table)."""
        undo = list(undo or [])
        if rec is None or rec.done is None:  # refused or failed: what is on view is unchanged
            return {"edit_pending": None}
        if pending is not None and pending["ids"] == rec.given:
            entry = {**pending["before"], "continued": rec, "changes": pending["changes"]}
            undo = (undo + [entry])[-MAX_UNDO:]
        else:
            undo = []
        return {"edit_box": rec.answer_text, "edit_seam": self.edit_preview(rec, rec.answer_text, undo),
                "edit_pending": None, "edit_undo_stack": undo, "edit_undo": gr.update(interactive=bool(undo))}

    def edit_on_view(self, rec: RunRecord | None, undo=None) -> dict:
        """A run put on view again (a branch, an undo): its text in the box, and the seam table
        the box's text and the undo stack give."""
        if rec is None or rec.done is None:
            return {}
        return {"edit_box": rec.answer_text, "edit_seam": self.edit_preview(rec, rec.answer_text, undo)}

    def edit_undo(self, undo=None) -> dict:
        """Back to the run on view before the last continue from an edit: its text, bars,
        statistics, controls, branch tree and conversation."""
        undo = list(undo or [])
        if not undo:
            return {"edit_undo": gr.update(interactive=False)}
        before = undo.pop()
        rec, nodes, history = before["record"], before["branches"], before["history"]
        viewing = next((k for k, n in enumerate(nodes) if n["record"] is rec), None)
        return {**self.runs.show(rec), "branches": nodes, "branch_view": tree_html(nodes, viewing),
                "history": history, "conversation": conversation_html(history), "edit_box": rec.answer_text,
                "edit_seam": self.edit_preview(rec, rec.answer_text, undo), "edit_undo_stack": undo,
                "edit_undo": gr.update(interactive=bool(undo))}

    @takes_controls("edited_text")
    def continue_edit(self, c: Controls, edited_text, request: gr.Request = None) -> Iterator[dict]:
        """/continue_edit for scripts: the prompt and settings as /generate's, and the edited
        output: the run continues after the prompt's ids and the edited text's, with the same
        checks and refusals as /generate."""
        try:
            c, _, _ = self._edit(c, edited_text)
            rec = self.runs.prepare(c, None)  # the same checks as /generate's
        except TokenLabError as e:
            raise page_error(e) from None
        yield from self.runs.stream(rec, request)
