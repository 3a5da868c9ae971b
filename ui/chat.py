"""The chat section: the conversation so far, "Regenerate last answer" and "New conversation".
A follow-up in chat mode continues the conversation (its run is the run section's)."""

from __future__ import annotations

import json
import gradio as gr

from ui.base import Section
from ui.controls import EXAMPLE_PROMPTS
from ui.shared.conversation import conversation_html


def seed_note(seed) -> str:
    """Under the chat buttons after Regenerate: why a fixed seed gives the same answer again."""
    seed = "" if seed is None else str(seed).strip()
    if not seed:
        return ""
    return (f"Seed {seed} is fixed, so the same settings give the same answer again: clear the seed box "
            "for a different one.")


class ChatHandlers(Section):
    def pop_last_turn(self, history, seed=None) -> dict:
        """Regenerate: the last answer dropped, its user message back in the prompt box (the
        run then starts as for Generate), and with a seed in its box a note that the answer will
        be the same. Queued, so that a refusal is a message, not an HTTP error, and the run does
        not start."""
        history = list(history or [])
        if len(history) < 2 or history[-1].get("role") != "assistant":
            raise gr.Error("There is no answer to regenerate: send a message in chat mode first.",
                           print_exception=False)
        rest = history[:-2]
        return {"history": rest, "prompt": history[-2]["content"], "mode": "chat",
                "conversation": conversation_html(rest), "chat_note": seed_note(seed)}

    def new_conversation(self, prompt=None, mode="chat", system="", max_new_tokens=None, model=None) -> dict:
        """The conversation forgotten (a branch of one of its answers too), and the context
        counter without its turns."""
        return {"history": [], "conversation": conversation_html([]), "regenerate": gr.update(interactive=False),
                "chat_note": "", "prefix_ids": "",
                "context_count": self.runs.count_context(prompt, mode, system, max_new_tokens, [], model)}

    def switch_mode(self, mode) -> dict:
        """The chat's buttons and its conversation show in chat mode only: a completion run
        ignores the conversation (kept, and shown again back in chat mode)."""
        chat = mode == "chat"
        return {"chat_buttons": gr.update(visible=chat), "conversation": gr.update(visible=chat)}

# A mode chosen while the prompt is the other mode's example: that mode's example takes its place
# (the completion example is one click from the chat one); a prompt of the person's own stays.
EXAMPLE_FOR_MODE_JS = """(mode, prompt) => {
    const examples = %s;
    return Object.values(examples).includes(prompt) && mode in examples ? examples[mode] : prompt;
}""" % json.dumps(EXAMPLE_PROMPTS)


SLOT = "run.input"  # under Generate and Stop


def build(page, h) -> None:
    """Under Generate and Stop: shown in chat mode only, with a note after Regenerate."""
    with page.add("chat_buttons", gr.Column(visible=h.page.defaults.mode == "chat", elem_id="chat-buttons")):
        with gr.Row():
            page.add("regenerate", gr.Button("Regenerate last answer", size="sm", interactive=False,
                                             elem_id="regenerate"))
            page.add("new_chat", gr.Button("New conversation", size="sm", elem_id="new-conversation"))
        page.add("chat_note", gr.Markdown("", elem_id="chat-note"))


def wire(page, h, demo) -> None:
    # Regenerate: the last answer dropped, its message back in the box, then the run as Generate's.
    regenerate = page.on(page["regenerate"].click, h.chat.pop_last_turn, inputs=("history", "seed"),
                         outputs=("history", "prompt", "mode", "conversation", "chat_note"), api_visibility="private",
                         show_progress="hidden")
    page.chain_run(regenerate.success)
    page.on(page["mode"].change, h.chat.switch_mode, inputs=("mode",), outputs=("chat_buttons", "conversation"),
            queue=False, api_visibility="private", show_progress="hidden")
    # A person's choice only (input): a link or saved work setting the mode keeps its prompt. In
    # the browser: a server round trip could land after the person has begun typing.
    page["mode"].input(None, inputs=page.all(("mode", "prompt")), outputs=page["prompt"], js=EXAMPLE_FOR_MODE_JS)
    page.on(page["new_chat"].click, h.chat.new_conversation,
            inputs=("prompt", "mode", "system", "max_new_tokens", "model"),
            outputs=("history", "conversation", "regenerate", "chat_note", "prefix_ids", "context_count"),
            queue=False, api_visibility="private")
