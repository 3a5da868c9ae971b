"""The lesson "Follow one token": its entry under the page's title, and its panel, one chapter
at a time with Back and Next, on the page's prompt and model (or an example)."""

from __future__ import annotations

import gradio as gr

from inference.lesson.explain import EXAMPLES, STEPS
from server.limits import ENGINE
from ui.controls import NAMES

OUTPUTS = ("lesson_data", "lesson_index", "lesson_view", "lesson_back", "lesson_next")
FOLLOW_CHOICES = [("the most likely token", "top"), ("a sampled token", "sampled")]


def build(page, h) -> None:
    """The entry (a button right under the title) and the panel it opens, hidden until then."""
    add = page.add
    add("lesson_open", gr.Button("▶ Follow one token: a guided lesson on your prompt", variant="primary",
                                 elem_id="lesson", size="md"))
    with add("lesson_panel", gr.Column(visible=False, elem_id="lesson-panel")):
        gr.Markdown("**Follow one token.** How the model predicts the next token of your prompt, in 9 short "
                    f"chapters with this prompt's real numbers: the engine runs it ({STEPS} tokens), looks inside "
                    "the model and measures this machine. Each chapter says where on the page to explore further.",
                    elem_id="lesson-intro")
        add("lesson_prompt", gr.Textbox(label="Prompt the lesson follows", lines=1, elem_id="lesson-prompt"))
        with gr.Row(elem_id="lesson-options"):
            add("lesson_mode", gr.Radio(["completion", "chat"], value="completion", label="Read the prompt in",
                                        elem_id="lesson-mode", info="the page's mode; an example is a text to continue"))
            add("lesson_follow", gr.Radio(FOLLOW_CHOICES, value="top", label="Follow", elem_id="lesson-follow",
                                          info="sampled: drawn with the page's sampling settings and seed"))
        with gr.Row(elem_id="lesson-examples"):
            for k, text in enumerate(EXAMPLES):
                add(f"lesson_example_{k}", gr.Button(f"Example: {text}", size="sm", elem_id=f"lesson-example-{k}",
                                                     min_width=120))
            add("lesson_start", gr.Button("Start the lesson", variant="primary", size="sm", elem_id="lesson-start",
                                          min_width=120))
        add("lesson_view", gr.HTML("", elem_id="lesson-view"))
        with gr.Row(elem_id="lesson-nav"):
            add("lesson_back", gr.Button("← Back", interactive=False, elem_id="lesson-back", min_width=80))
            add("lesson_next", gr.Button("Next →", interactive=False, elem_id="lesson-next", min_width=80))
            add("lesson_close", gr.Button("Close", variant="secondary", elem_id="lesson-close", min_width=80))
    add("lesson_data", gr.State(None))
    add("lesson_index", gr.State(0))


def wire(page, h, demo) -> None:
    # The page's model, sampling settings and seed (its prompt box and mode are not the lesson's).
    start = dict(inputs=(*NAMES, "lesson_prompt", "lesson_mode", "lesson_follow"), outputs=OUTPUTS,
                 api_visibility="private", concurrency_id=ENGINE)
    # The entry opens the panel on the page's prompt, in the page's mode, and starts the lesson at once.
    opened = page["lesson_open"].click(lambda prompt, mode: (gr.update(visible=True), prompt, mode),
                                       inputs=page.all(("prompt", "mode")),
                                       outputs=page.all(("lesson_panel", "lesson_prompt", "lesson_mode")), queue=False,
                                       api_visibility="private")
    page.on(opened.then, h.lesson.lesson_start, **start)
    page.on(page["lesson_start"].click, h.lesson.lesson_start, **start)
    for k, text in enumerate(EXAMPLES):  # a text to continue: completion mode
        chosen = page[f"lesson_example_{k}"].click(lambda t=text: (t, "completion"),
                                                    outputs=page.all(("lesson_prompt", "lesson_mode")), queue=False,
                                                    api_visibility="private")
        page.on(chosen.then, h.lesson.lesson_start, **start)
    moves = dict(inputs=("lesson_data", "lesson_index"), outputs=OUTPUTS[1:], api_visibility="private", queue=False)
    page.on(page["lesson_next"].click, h.lesson.lesson_next, **moves)
    page.on(page["lesson_back"].click, h.lesson.lesson_back, **moves)
    page["lesson_close"].click(lambda: gr.update(visible=False), outputs=page["lesson_panel"], queue=False,
                               api_visibility="private")
