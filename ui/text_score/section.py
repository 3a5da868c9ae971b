"""The "probability of a text" panel's components and events; /score_text for scripts. A token of
the scored text clicked opens, under it, the choices to run from there; one of them clicked
starts the tab's next run through the run section's chain (Page.chain_run)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from server.limits import ENGINE
from ui.text_score.render import scored_html

ASSETS = Path(__file__).parent.parent / "assets"

# The output's script places a token's popover in the window (and ignores clicks on tokens
# without a step): the same for the scored text.
POPOVER_JS = (ASSETS / "output.js").read_text(encoding="utf-8")
# The choices to run from a token: each a [data-pick], clicked or Entered (a select event).
PICK_JS = (ASSETS / "pick.js").read_text(encoding="utf-8")
EXAMPLE = "The capital of France is Paris. The capital of Germany is Paris."
OUTPUTS = ("score_view", "score_md", "score_data")
# The page's own scoring also keeps what a click on a token runs from, and the hint to click one.
SHOWN = (*OUTPUTS, "score_state", "score_branch")


def build(page, h) -> None:
    add = page.add
    with gr.Accordion("Probability of a text: how likely the model finds every token of any text",
                      open=False, elem_id="score-panel"):
        gr.Markdown("Each token is coloured by its probability given the text before it (one forward pass). "
                    "Hover or tap a token for its probability, its rank among all tokens (1 = the model's top "
                    "choice) and its surprisal; click it for the tokens the model preferred there.")
        add("score_box", gr.Textbox(EXAMPLE, label="Text", lines=3, elem_id="score-text"))
        with gr.Row():
            add("score_button", gr.Button("Score the text", variant="primary", elem_id="score"))
            add("score_prompt_button", gr.Button("Score the prompt of the run", elem_id="score-prompt"))
        add("score_md", gr.Markdown("", label="Text summary", elem_id="score-summary"))
        add("score_view", gr.HTML(scored_html([]), label="Scored text", elem_id="score-view",
                                  js_on_load=POPOVER_JS))
        add("score_branch", gr.HTML("", label="Run from a token", elem_id="score-branch", js_on_load=PICK_JS))
        add("score_data", gr.JSON(visible=False, label="Scores"))
        add("score_state", gr.State(None))


def wire(page, h, demo) -> None:
    # /score_text for scripts refuses with an error; the page's click says why in the panel
    # (Gradio's error marks every output, and the prompt's the Text box, hiding what was typed).
    page.on(gr.Button(visible=False).click, h.text_score.score_text, inputs=("score_box", "model"), outputs=OUTPUTS,
            api_name="score_text", concurrency_id=ENGINE)
    page.on(page["score_button"].click, h.text_score.score_text_shown, inputs=("score_box", "model"), outputs=SHOWN,
            api_visibility="private", concurrency_id=ENGINE)
    page.on(page["score_prompt_button"].click, h.text_score.score_prompt, inputs=("record",), outputs=("score_box", *SHOWN),
            api_visibility="private", concurrency_id=ENGINE)
    # A token clicked: the choices to run from it; one of them clicked: the run, by the run
    # section's chain (begin takes the point Runs.open_next kept). Queued (unlimited), so that
    # its refusal is a message; only then does the run start.
    page.on(page["score_view"].select, h.text_score.pick_token, inputs=("score_state",), outputs=("score_branch",),
            api_visibility="private", queue=False, show_progress="hidden")
    picked = page.on(page["score_branch"].select, h.text_score.run_from_text, inputs=("score_state", "model"),
                     outputs=("prompt", "mode", "prefix_ids"), api_visibility="private", concurrency_limit=None,
                     show_progress="hidden")
    page.chain_run(picked.success)
