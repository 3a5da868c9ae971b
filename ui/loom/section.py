"""The loom's components and events: from a step of the run on view (its end, or the prompt) the
tree of continuations grows through the scheduler; a leaf clicked continues as a run (the run
section's chain); the tree is kept in this browser, as a download and in a link."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from inference.decoding.tree import MAX_DEPTH
from server.limits import ENGINE
from ui.controls import NAMES
from ui.loom import render
from ui.loom.handlers import FROM, LOOM_OUTPUTS, RESTORE_OUTPUTS

PICK_JS = (Path(__file__).parent.parent / "assets" / "pick.js").read_text(encoding="utf-8")
# The browser's storage key of the last tree (encrypted by gradio with the page's own key, as the
# saved work is: kept from plain reading only; it never leaves the browser).
LOOM_KEY, SECRET = "tokenlab-loom", "token-lab-saved-work"
BASE_JS = "() => window.location.origin + window.location.pathname"


def build(page, h) -> None:
    add = page.add
    most = h.loom.tree_limits().nodes
    with add("loom_panel", gr.Accordion("Loom: grow the tree of continuations", open=False, elem_id="loom-panel")):
        gr.Markdown("From a step of the run on view, every next token the model gives at least the threshold "
                    "p and ranks in the top k (0 turns either off) becomes a node, and so on to the depth, within "
                    "the node budget: one "
                    "scheduler run, a level a step, beside everyone else's runs. The probabilities are the model's "
                    "own; under each node, the probability of the tokens left out.")
        with gr.Row(elem_id="loom-controls"):
            add("loom_from", gr.Radio(list(FROM), value=FROM[0], label="Grow from", elem_id="loom-from"))
            add("loom_p", gr.Number(0.05, minimum=0, maximum=1, label="Threshold p (0 = off)", elem_id="loom-p"))
            add("loom_k", gr.Number(3, precision=0, minimum=0, label="Top k per node (0 = off)", elem_id="loom-k"))
            add("loom_depth", gr.Slider(1, MAX_DEPTH, value=3, step=1, label="Depth", elem_id="loom-depth"))
            add("loom_nodes", gr.Slider(1, most, value=min(32, most), step=1,
                                        label=f"Node budget (at most {most})", elem_id="loom-nodes"))
        with gr.Row():
            add("loom_button", gr.Button("Grow the tree", variant="primary", elem_id="loom-grow"))
            # Ends the session's one job (a growing tree: within its level), as Stop does a run.
            add("loom_stop", gr.Button("Stop", variant="secondary", elem_id="loom-stop"))
            add("loom_link_button", gr.Button("Link and download", elem_id="loom-link"))
        add("loom_md", gr.HTML("", elem_id="loom-summary"))
        add("loom_links", gr.HTML(render.links_html(None, None), elem_id="loom-links"))
        add("loom_view", gr.HTML(render.tree_html([]), label="The loom's tree", elem_id="loom-view",
                                 js_on_load=PICK_JS))
        add("loom_state", gr.State(None))
        add("loom_url", gr.Textbox(visible=False))
    # Outside the accordion: a component in a closed one is mounted only once it opens, and the
    # browser's copy is read when it is mounted (at load, the restore would find none).
    add("loom_saved", gr.BrowserState(None, storage_key=LOOM_KEY, secret=SECRET))
    # At load (ui/work's event, after the link's settings): a link's tree, else this browser's.
    page.load_hooks.append((h.loom.restore, ("loom_saved",), RESTORE_OUTPUTS))


def wire(page, h, demo) -> None:
    page.on(page["loom_button"].click, h.loom.grow,
            inputs=(*NAMES, "record", "history", "step", "loom_from", "loom_p", "loom_k", "loom_depth", "loom_nodes"),
            outputs=LOOM_OUTPUTS, concurrency_id=ENGINE, api_visibility="private", show_progress="hidden")
    page["loom_stop"].click(h.run.stop_job, inputs=None, outputs=None, queue=False, api_visibility="private")
    # Queued (unlimited), so that its refusal is a message; only then does the run start.
    picked = page.on(page["loom_view"].select, h.loom.continue_leaf, inputs=("loom_state",),
                     outputs=(*NAMES, "history", "conversation"), api_visibility="private", concurrency_limit=None,
                     show_progress="hidden")
    page.chain_run(picked.success)  # the run section's chain: begin -> the run -> its end
    based = page["loom_link_button"].click(None, js=BASE_JS, outputs=page["loom_url"], api_visibility="private",
                                           queue=False)
    page.on(based.then, h.loom.link, inputs=("loom_state", "loom_url"), outputs=("loom_links",), queue=False,
            show_progress="hidden", api_visibility="private")
