"""The quantization lens's components and event: the model picked above at float32 and at the
precisions picked here (quantized by the engine on request, or a GGUF source's own blocks), on
this section's prompt, token by token."""

from __future__ import annotations

import gradio as gr

from inference.lenses.precisions import MAX_NEW_TOKENS
from server.limits import ENGINE
from ui.widgets import UNCHECKED

OUTPUTS = ("lens_md", "lens_view")
PROMPT = "The capital of France is"
DEFAULT_TOKENS = 16
CHOICES = [("Q8_0", "q8_0"), ("Q5_0", "q5_0"), ("Q4_1", "q4_1"), ("Q4_0", "q4_0"),
           ("the GGUF file's own blocks", "file")]
INTRO = ("The model picked above in float32 beside the same weights quantized by the engine (every weight matrix, "
         "the embedding included, into GGUF's Q8_0, Q5_0, Q4_1 or Q4_0 blocks; the norms stay float32), or a GGUF "
         "file's own blocks. Every precision reads float32's greedy text: per step, the KL divergence from "
         "float32, top-1 agreement and the rank of float32's top token; then its own greedy text, where it forks, "
         "its bytes per token, decode tok/s and perplexity. Where the model is itself a quantized GGUF file, its "
         "float32 is its dequantized blocks, and the lens says so: it then measures quantizing again.")


def build(page, h) -> None:
    add = page.add
    limits = h.page.limits
    most = min(MAX_NEW_TOKENS, limits.max_new_tokens or MAX_NEW_TOKENS)
    bound = limits.lens_precisions
    with gr.Accordion("Quantization lens: the model at several precisions, token by token", open=False,
                      elem_id="lens-panel"):
        gr.Markdown(INTRO, elem_id="lens-intro")
        # Our own text, escaped: not sanitized, so that its terms keep their definitions.
        add("lens_note", gr.Markdown(h.lens.model_note(""), elem_id="lens-note", sanitize_html=False))
        # It follows the model picked (ui/run/section.wire runs these hooks once it is loaded).
        page.after_pick.append((h.lens.model_note, ("model",), ("lens_note",)))
        add("lens_prompt", gr.Textbox(PROMPT, label="Prompt", lines=2, elem_id="lens-prompt"))
        with gr.Row():
            add("lens_precisions", gr.CheckboxGroup(
                CHOICES, value=["q8_0", "q4_0"], label="Precisions beside float32",
                info="float32 is the reference, always measured; each precision is made and measured in turn"
                     + (f"; at most {bound} on this server" if bound is not None else ""),
                elem_id="lens-precisions", min_width=280))
            with gr.Column(min_width=200):
                add("lens_tokens", gr.Slider(1, most, value=min(DEFAULT_TOKENS, most), step=1, label="Max new tokens",
                                             info="greedy tokens of float32's text", elem_id="lens-tokens",
                                             elem_classes=[UNCHECKED]))  # the handler checks it, naming the cap
                add("lens_chat", gr.Checkbox(False, label="Read the prompt as a chat message", elem_id="lens-chat"))
        with gr.Row():
            add("lens_button", gr.Button("Compare the precisions", variant="primary", elem_id="lens-run", scale=3))
            # Ends the session's one job (the lens, after the precision being measured), as Stop does a run.
            add("lens_stop", gr.Button("Stop", variant="secondary", elem_id="lens-stop", scale=1))
        add("lens_md", gr.Markdown("", label="Quantization lens summary", elem_id="lens-summary",
                                   sanitize_html=False))
        add("lens_view", gr.HTML("", label="Quantization lens per step", elem_id="lens-view"))


def wire(page, h, demo) -> None:
    page.on(page["lens_button"].click, h.lens.lens,
            inputs=("model", "lens_prompt", "lens_precisions", "lens_tokens", "lens_chat"), outputs=OUTPUTS,
            concurrency_id=ENGINE, api_visibility="private", show_progress="minimal")
    page["lens_stop"].click(h.run.stop_job, inputs=None, outputs=None, queue=False, api_visibility="private")
