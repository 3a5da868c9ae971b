"""The conversation of chat mode, as the run section adds a turn to it, the chat section clears
it, a branch or an undo puts one back, and the saved work restores it: its HTML, and the turn an
ended run adds."""

from __future__ import annotations

import html

from inference.loading.byte_pieces import hex_pieces, readable_text, unfinished_tail_bytes
from ui.run_state import RunRecord, turn_messages


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
