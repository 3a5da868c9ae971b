"""The chat section: the conversation so far, "Regenerate last answer" and "New conversation".
A follow-up in chat mode continues the conversation (its run is the run section's)."""

from __future__ import annotations

import html

import gradio as gr

from ui.base import PageBase
from ui.run_state import RunRecord, turn_messages


def conversation_html(history: list[dict]) -> str:
    """The chat so far (earlier turns, oldest first); empty when there is none."""
    if not history:
        return ""
    turns = "".join(f"<div class='tl-turn tl-turn-{html.escape(m['role'])}'><b>{html.escape(m['role'])}:</b> "
                    f"{html.escape(m['content'])}</div>" for m in history)
    return (f"<div class='tl-conv'><div class='tl-title'>Conversation so far ({len(history) // 2} "
            f"turn{'s' * (len(history) // 2 != 1)}; your next message continues it)</div>{turns}</div>")


def turn_if_answered(rec: RunRecord) -> list[dict]:
    """The chat turn to keep: a stopped run that produced nothing adds none."""
    turn = turn_messages(rec)
    if turn and rec.done.reason == "cancelled" and not rec.done.text:
        return []
    return turn


class ChatHandlers(PageBase):
    def pop_last_turn(self, history) -> dict:
        """Regenerate: the last answer dropped, its user message back in the prompt box (the
        run then starts as for Generate). Queued, so that a refusal is a message, not an HTTP
        error, and the run does not start."""
        history = list(history or [])
        if len(history) < 2 or history[-1].get("role") != "assistant":
            raise gr.Error("There is no answer to regenerate: send a message in chat mode first.",
                           print_exception=False)
        rest = history[:-2]
        return {"history": rest, "prompt": history[-2]["content"], "mode": "chat",
                "conversation": conversation_html(rest)}

    def new_conversation(self) -> dict:
        return {"history": [], "conversation": conversation_html([]), "regenerate": gr.update(interactive=False)}


def build_buttons(page, mode: str) -> None:
    """Under Generate and Stop: shown in chat mode only."""
    with page.add("chat_buttons", gr.Row(visible=mode == "chat", elem_id="chat-buttons")):
        page.add("regenerate", gr.Button("Regenerate last answer", size="sm", interactive=False,
                                         elem_id="regenerate"))
        page.add("new_chat", gr.Button("New conversation", size="sm", elem_id="new-conversation"))


def wire(page, h: ChatHandlers) -> None:
    page["mode"].change(lambda m: gr.update(visible=m == "chat"), inputs=page["mode"],
                        outputs=page["chat_buttons"], queue=False, api_visibility="private",
                        show_progress="hidden")
    page.on(page["new_chat"].click, h.new_conversation, outputs=("history", "conversation", "regenerate"),
            queue=False, api_visibility="private")
