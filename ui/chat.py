"""The chat section: the conversation so far, "Regenerate last answer" and "New conversation".
A follow-up in chat mode continues the conversation (its run is the run section's)."""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING

import gradio as gr

from inference.loading.byte_pieces import hex_pieces, readable_text, unfinished_tail_bytes
from ui.base import PageContext, Section
from ui.controls import EXAMPLE_PROMPTS
from ui.run_state import RunRecord, turn_messages

if TYPE_CHECKING:
    from ui.run.handlers import RunHandlers


def conversation_html(history: list[dict]) -> str:
    """The chat so far (earlier turns, oldest first); empty when there is none."""
    if not history:
        return ""
    turns = "".join(f"<div class='tl-turn tl-turn-{html.escape(m['role'])}'><b>{html.escape(m['role'])}:</b> "
                    f"{html.escape(m.get('shown', m['content']))}</div>" for m in history)
    return (f"<div class='tl-conv'><div class='tl-title'>Conversation so far ({len(history) // 2} "
            f"turn{'s' * (len(history) // 2 != 1)}; your next message continues it)</div>{turns}</div>")


def turn_if_answered(rec: RunRecord, token_bytes: list[bytes] | None) -> list[dict]:
    """The chat turn to keep: a stopped run that produced nothing adds none. Where the answer's
    bytes make no character somewhere, the conversation shows them as pieces ("shown"; the
    chat template is given the text, as the tokenizer decodes it)."""
    turn = turn_messages(rec)
    if turn and rec.done.reason == "cancelled" and not rec.done.text:
        return []
    # (After a stop string the bytes run on past the text: its answer keeps the text.)
    if turn and token_bytes and "\ufffd" in turn[-1]["content"] and rec.done.reason != "stop":
        ids = rec.given + [s.token_id for s in (rec.steps[:-1] if rec.done.reason == "eos" else rec.steps)]
        data = b"".join(token_bytes[i] for i in ids)
        cut = unfinished_tail_bytes(data)
        shown = readable_text(data[:len(data) - len(cut)])
        turn[-1]["shown"] = shown + (f" [cut off: {hex_pieces(cut)}]" if cut else "")
    return turn


def seed_note(seed) -> str:
    """Under the chat buttons after Regenerate: why a fixed seed gives the same answer again."""
    seed = "" if seed is None else str(seed).strip()
    if not seed:
        return ""
    return (f"Seed {seed} is fixed, so the same settings give the same answer again: clear the seed box "
            "for a different one.")


class ChatHandlers(Section):
    def __init__(self, page: PageContext, run: "RunHandlers"):
        super().__init__(page)
        self.run = run

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
                "context_count": self.run.count_context(prompt, mode, system, max_new_tokens, [], model)}

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


def build_buttons(page, mode: str) -> None:
    """Under Generate and Stop: shown in chat mode only, with a note after Regenerate."""
    with page.add("chat_buttons", gr.Column(visible=mode == "chat", elem_id="chat-buttons")):
        with gr.Row():
            page.add("regenerate", gr.Button("Regenerate last answer", size="sm", interactive=False,
                                             elem_id="regenerate"))
            page.add("new_chat", gr.Button("New conversation", size="sm", elem_id="new-conversation"))
        page.add("chat_note", gr.Markdown("", elem_id="chat-note"))


def wire(page, h: ChatHandlers) -> None:
    page.on(page["mode"].change, h.chat.switch_mode, inputs=("mode",), outputs=("chat_buttons", "conversation"),
            queue=False, api_visibility="private", show_progress="hidden")
    # A person's choice only (input): a link or saved work setting the mode keeps its prompt. In
    # the browser: a server round trip could land after the person has begun typing.
    page["mode"].input(None, inputs=page.all(("mode", "prompt")), outputs=page["prompt"], js=EXAMPLE_FOR_MODE_JS)
    page.on(page["new_chat"].click, h.chat.new_conversation,
            inputs=("prompt", "mode", "system", "max_new_tokens", "model"),
            outputs=("history", "conversation", "regenerate", "chat_note", "prefix_ids", "context_count"),
            queue=False, api_visibility="private")
