"""Chat templates: the model's jinja2 template rendered in a sandbox."""

from __future__ import annotations

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InputError


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


def chat_messages(prompt: str, system: str | None = None) -> list[dict]:
    messages = [{"role": "system", "content": system}] if system and system.strip() else []
    return messages + [{"role": "user", "content": prompt}]
