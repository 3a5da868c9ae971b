"""The branch tree's components and events: under the bars, the tree of a run's branches; a
candidate clicked in the bars starts a branch through the run section's chain of events."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ui.controls import NAMES
from ui.shared.outputs import RUN_OUTPUTS, SHOWN
from ui.shared.tree import tree_html
from server.limits import ENGINE

SLOT = "run.bars"  # under the bars
PICK_JS = (Path(__file__).parent.parent / "assets" / "pick.js").read_text(encoding="utf-8")
LEAVE_JS = (Path(__file__).parent.parent / "assets" / "leave.js").read_text(encoding="utf-8")


def by_hand_js(box: str) -> str:
    """The change event's function in the browser: the given ids dropped where the change of
    `box` was made by hand (leave.js marks it), kept otherwise."""
    return (f"(ids) => {{ const hand = !!(window.tlByHand && window.tlByHand[{box!r}]); "
            f"if (window.tlByHand) window.tlByHand[{box!r}] = false; return hand ? '' : ids; }}")


def build(page, h) -> None:
    """The tree (laid out by the run section, under the bars) and its state; a run's end adds
    the run to it."""
    page.add("branches", gr.State([]))
    page.add("branch_view", gr.HTML(tree_html([], None), label="Branches", elem_id="branches",
                                    js_on_load=PICK_JS + "\n" + LEAVE_JS))
    page.after_run.append((h.branches.grow_tree, ("record", "branches"), ("branches", "branch_view")))


def wire(page, h, demo) -> None:
    # /branch for scripts: the session's last run (its /generate) continued from a candidate.
    api = gr.Button(visible=False)
    page.add("branch_step", gr.Number(visible=False, label="Step"))
    page.add("branch_token", gr.Number(visible=False, label="Token id"))
    page.on(api.click, h.branches.branch_run, inputs=("record", "branch_step", "branch_token"), outputs=RUN_OUTPUTS,
            api_name="branch", show_progress="hidden", concurrency_id=ENGINE, postprocess=False)
    # Queued (unlimited), so that its refusal is a message; only then does the branch run.
    picked = page.on(page["bars"].select, h.branches.branch, inputs=("record", "branches"),
                     outputs=(*NAMES, "branches", "history", "conversation"), api_visibility="private", concurrency_limit=None,
                     show_progress="hidden")
    page.chain_run(picked.success)  # the run section's chain: begin -> the run -> its end
    # The given ids are a branch's of one prompt: typing another (or another system prompt, mode
    # or model) leaves the branch. `input`: by hand only, not a link's or a branch's own setting.
    page.on(lambda fn, **kw: gr.on([page[n].input for n in ("prompt", "system", "mode", "model")], fn, **kw),
            h.branches.leave_branch, inputs=("prefix_ids",), outputs=("prefix_ids",), queue=False, show_progress="hidden",
            api_visibility="private")
    # Gradio's `input` comes with key presses only: a paste, a cut, a drop or a script's fill
    # changes the box without it. Every change of the prompt's text made by hand (leave.js) leaves
    # the branch too, in the browser alone.
    for n in ("prompt", "system"):
        page[n].change(None, inputs=page["prefix_ids"], outputs=page["prefix_ids"], js=by_hand_js(n),
                       queue=False, show_progress="hidden", api_visibility="private")
    viewed = page.on(page["branch_view"].select, h.branches.view_branch, inputs=("branches",),
                     outputs=(*SHOWN, "branch_view"), api_visibility="private", queue=False, show_progress="hidden")
    page.chain(viewed, page.after_view)
