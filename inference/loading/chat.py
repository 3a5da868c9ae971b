"""Chat templates: the model's jinja2 template rendered in a sandbox."""

from __future__ import annotations

import re

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference.errors import InputError


def _raise(message):
    raise TemplateError(message)


def render_chat(template: str | None, messages: list[dict], *, bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True) -> str:
    """Render messages with the template. The sandbox keeps templates away from Python internals."""
    if not template:
        raise InputError("this model has no chat template; use completion mode")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token)
    except Exception as e:  # jinja2 and the sandbox raise many types; all mean "template failed"
        raise InputError(f"the chat template failed: {type(e).__name__}: {e}") from None


PLACEHOLDER = "\ue000{}\ue001"  # private-use characters: no template writes them
_SPLIT = re.compile("\ue000(\\d+)\ue001")


def render_chat_segments(template: str | None, messages: list[dict], **kwargs) -> tuple[str, list[tuple[str, bool]]]:
    """The rendered prompt, and the same text cut into (text, written by the template) parts:
    the messages' contents are the user's text, everything else the template's. Only the
    template's parts may hold control tokens, so a user cannot end a turn by typing one."""
    text = render_chat(template, messages, **kwargs)
    marked = render_chat(template, [{**m, "content": PLACEHOLDER.format(i)} for i, m in enumerate(messages)],
                         **kwargs)
    pieces = _SPLIT.split(marked)  # template, index, template, index, ..., template
    for transform in (lambda c: c, str.strip):  # a template may trim the content
        parts = []
        for j, piece in enumerate(pieces):
            parts.append((piece, True) if j % 2 == 0 else (transform(messages[int(piece)]["content"]), False))
        if "".join(p for p, _ in parts) == text:
            return text, [p for p in parts if p[0]]
    # A template whose text depends on the content: no part can be told from the user's.
    raise InputError("the chat template changes the message text in a way Token Lab cannot "
                     "follow; use completion mode")


def chat_messages(prompt: str, system: str | None = None, history: list[dict] | None = None) -> list[dict]:
    """The system message (if any), the earlier turns (user and assistant messages, oldest
    first), then the new user message."""
    messages = [{"role": "system", "content": system}] if system and system.strip() else []
    for m in history or ():
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
            raise InputError("each earlier chat turn must be a user or assistant message with text")
        messages.append({"role": m["role"], "content": m["content"]})
    return messages + [{"role": "user", "content": prompt}]


def default_system_prompt(template: str | None, **kwargs) -> str:
    """The system prompt the template adds by itself when the messages have none ("" if it adds
    none): the text the rendered conversation without a system message has where a system
    message's content would be."""
    if not template:
        return ""
    user = [{"role": "user", "content": "\ue000"}]
    marker = "\ue001"
    try:
        without = render_chat(template, user, **kwargs)
        with_marker = render_chat(template, [{"role": "system", "content": marker}] + user, **kwargs)
    except InputError:
        return ""
    if with_marker.count(marker) != 1:
        return ""
    before, after = with_marker.split(marker)
    if without == before + after or not (without.startswith(before) and without.endswith(after)):
        return ""
    return without[len(before):len(without) - len(after)].strip()


def turn_end_ids(tokenizer) -> tuple[int, ...]:
    """The control token a chat template writes right after an assistant's message, where it ends
    the turn (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>): a chat run stops there, as the
    model's own serving does. () where the template writes none or cannot be rendered so."""
    template, marker = tokenizer.chat_template, "\ue000"
    if not template:
        return ()
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}]
    try:
        text = render_chat(template, turn, add_generation_prompt=False, bos_token=tokenizer.bos_token,
                           eos_token=tokenizer.eos_token)
    except InputError:
        return ()
    if text.count(marker) != 1:
        return ()
    after = text.split(marker)[1]
    ends = [(s, i) for s, i in tokenizer.special_tokens.items() if s and after.startswith(s)]
    return (max(ends, key=lambda e: len(e[0]))[1],) if ends else ()
