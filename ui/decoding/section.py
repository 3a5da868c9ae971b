"""The decoding section's components and events: beam search (the decoding settings of the
schema) and speculative decoding (a drafter and its proposals a round), each run on the page's
prompt and settings, drawn step by step."""

from __future__ import annotations

import gradio as gr

from inference.decoding.speculative import MAX_DRAFT_TOKENS
from inference.sampling.settings import BY_NAME
from ui.controls import NAMES
from server.limits import ENGINE
from ui.decoding.render import drafters
from ui.widgets import setting_control

OUTPUTS = ("decoding_md", "decoding_view")
BEAM_OUTPUTS = (*OUTPUTS, "beam_state", "beam_pick", "open_beam")
def build(page, h) -> None:
    add = page.add
    d = h.page.defaults
    layers = h.page.info.cfg.n_layers if h.page.info.cfg is not None else 2
    with gr.Accordion("Decoding: beam search and speculative decoding", open=False, elem_id="decoding-panel"):
        gr.Markdown("Both run on the prompt and settings above. **Beam search** keeps the most likely "
                    "sequences by their whole log-probability, as transformers' `num_beams` does. "
                    "**Speculative decoding** lets a drafter propose tokens that the model checks in one pass; "
                    "the rejection rule keeps the text's distribution the model's own.")
        with gr.Row():
            for s in BY_NAME.values():
                if s.group == "decoding":
                    add(s.name, setting_control(s, getattr(d, s.name), h.page.context, limits=h.page.limits,
                                                available=s.name in h.page.caps.settings))
            add("beam_button", gr.Button("Run beam search", variant="primary", elem_id="beam-search"))
        with gr.Row():
            choices, info = drafters(h.page.models, "")
            add("drafter", gr.Dropdown(choices, value="prompt-lookup", label="Drafter", info=info,
                                       elem_id="drafter"))
            add("exit_layer", gr.Number(max(1, layers // 4), precision=0, minimum=1, maximum=max(1, layers - 1),
                                        label=f"Early exit after layer (1-{max(1, layers - 1)})", elem_id="exit-layer"))
            add("draft_tokens", gr.Slider(1, MAX_DRAFT_TOKENS, value=4, step=1, label="Proposals a round (K)",
                                          elem_id="draft-tokens"))
            add("spec_button", gr.Button("Run speculative decoding", variant="primary", elem_id="speculative"))
        # The drafters follow the model picked (after its load), and at the page's load what the
        # server has loaded since it was built (ui/run/section.wire runs these hooks).
        page.after_pick.append((h.decoding.drafter_choices, ("model", "drafter"), ("drafter",)))
        add("decoding_md", gr.Markdown("", label="Decoding summary", elem_id="decoding-summary"))
        with gr.Row(elem_id="open-beam-row"):
            add("beam_pick", gr.Dropdown([], label="A finished beam", elem_id="beam-pick", interactive=False))
            add("open_beam", gr.Button("Open as a run", elem_id="open-beam", interactive=False))
        add("beam_state", gr.State(None))
        add("decoding_view", gr.HTML("", label="Decoding steps", elem_id="decoding-view"))


def wire(page, h, demo) -> None:
    page.on(page["beam_button"].click, h.decoding.beam_search, inputs=NAMES, outputs=BEAM_OUTPUTS,
            concurrency_id=ENGINE, api_visibility="private")
    # Queued (unlimited), so that its refusal is a message; only then does the run start.
    opened = page.on(page["open_beam"].click, h.decoding.open_beam, inputs=("beam_state", "beam_pick"),
                     outputs=(), concurrency_limit=None, api_visibility="private",
                     show_progress="hidden")
    page.chain_run(opened.success)  # the run section's chain: begin (the beam's tokens) -> the run -> its end
    page.on(page["spec_button"].click, h.decoding.speculative, inputs=(*NAMES, "drafter", "exit_layer", "draft_tokens"),
            outputs=OUTPUTS, concurrency_id=ENGINE, api_visibility="private")
