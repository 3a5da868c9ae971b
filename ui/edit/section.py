"""The edit panel's components and events: under the output, the run's text to edit, Continue
and Undo, and the seam table; /continue_edit for scripts."""

from __future__ import annotations

import gradio as gr

from server.limits import ENGINE
from ui.controls import NAMES
from ui.edit.render import EDIT_HINT
from ui.shared.outputs import RUN_OUTPUTS, SHOWN

SLOT = "run.output"  # under the output


def build(page, h) -> None:
    """The panel (closed until opened) and its state; a run's end puts its text in the box."""
    add = page.add
    with gr.Accordion("Edit the output and continue", open=False, elem_id="edit-panel"):
        gr.Markdown(EDIT_HINT, elem_id="edit-hint")
        add("edit_box", gr.Textbox("", label="The output, to edit", lines=4, max_lines=12, elem_id="edit-text",
                                   placeholder="A run's text comes here when it ends."))
        with gr.Row():
            add("edit_continue", gr.Button("Continue from this text", variant="primary", size="sm",
                                           elem_id="edit-continue"))
            add("edit_undo", gr.Button("Undo", size="sm", interactive=False, elem_id="edit-undo"))
        add("edit_seam", gr.HTML("", label="Tokens before and after the edit", elem_id="edit-seam"))
    add("edit_pending", gr.State(None))  # what a continue waits to keep for undo
    add("edit_undo_stack", gr.State([]))
    page.after_run.append((h.edit.edit_after_run, ("record", "edit_pending", "edit_undo_stack"),
                           ("edit_box", "edit_seam", "edit_pending", "edit_undo_stack", "edit_undo")))
    page.after_view.append((h.edit.edit_on_view, ("record", "edit_undo_stack"), ("edit_box", "edit_seam")))


def wire(page, h, demo) -> None:
    # /continue_edit for scripts, wired first so that it takes the name: /generate's inputs
    # and the edited text.
    api = gr.Button(visible=False)
    page.on(api.click, h.edit.continue_edit, inputs=(*NAMES, "edit_box"), outputs=RUN_OUTPUTS, api_name="continue_edit",
            show_progress="hidden", concurrency_id=ENGINE, postprocess=False)
    # Every change of the box, not gradio's input event: a Textbox sends that on a key press only
    # (no Backspace, Delete, paste, cut or drop). A run's end or an undo setting the box shows
    # the same table as the events that set it (edit_preview is a function of its inputs).
    page.on(page["edit_box"].change, h.edit.edit_preview, inputs=("record", "edit_box", "edit_undo_stack"),
            outputs=("edit_seam",), queue=False, api_visibility="private", show_progress="hidden",
            trigger_mode="always_last")
    # Queued (unlimited), so that its refusal is a message; only then does the run start.
    picked = page.on(page["edit_continue"].click, h.edit.edit_continue,
                     inputs=("record", "edit_box", "branches", "history"),
                     outputs=(*NAMES, "history", "branches", "edit_pending", "edit_seam"), api_visibility="private",
                     concurrency_limit=None, show_progress="hidden")
    page.chain_run(picked.success)  # the run section's chain: begin -> the run -> its end
    undone = page.on(page["edit_undo"].click, h.edit.edit_undo, inputs=("edit_undo_stack",),
            outputs=(*SHOWN, "branches", "branch_view", "history", "conversation", "edit_box", "edit_seam",
                     "edit_undo_stack", "edit_undo"),
            api_visibility="private", queue=False, show_progress="hidden")
    page.chain(undone, page.after_view)
