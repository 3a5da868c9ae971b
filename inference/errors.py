"""Errors a user can cause. Each carries a one-line message meant to be shown as is."""

import re


class TokenLabError(Exception):
    """Base class: the message is complete and needs no traceback."""


class ModelError(TokenLabError):
    """A model directory or file that cannot be loaded."""


class InputError(TokenLabError):
    """A prompt or sampling setting that cannot be used. `field`: the setting at fault by its
    schema name (top_k, seed, stop, ...), so that the page can call it by its label and the
    API name it as the error's param; None when no one field is."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ResourceError(TokenLabError):
    """The device ran out of memory during a run; the run ended, the engine keeps serving."""


class EngineClosed(TokenLabError):
    """The engine was closed (the program is stopping): it starts no more work."""


class EngineDown(TokenLabError):
    """The engine's scheduler died of an internal fault: every run was answered with this, and
    it takes no more until the program is restarted."""


def shown(value, limit: int = 40) -> str:
    """repr(value) for a message, cut to about `limit` characters: a value a visitor sent can be
    megabytes long, and the message must stay one short line (only the head is converted)."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value):,} long)"
    text = repr(value)
    return text if len(text) <= 2 * limit else text[:limit] + "…"


# A UTF-16 surrogate as a code point of its own: in a str it is always alone (a pair decodes to one
# code point), and UTF-8 has no encoding for it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(text: str, what: str, field: str | None = None) -> None:
    """InputError if `text` holds a lone UTF-16 surrogate (JSON's "\\ud800", or bytes that are not
    UTF-8 in a command line): no tokenizer can encode it. `what` names the text ("the prompt").
    Looked for without a copy of the text (an 8 MB prompt is refused by its length, cheaply)."""
    m = _SURROGATE.search(text)
    if m is not None:
        raise InputError(f"{what} holds a lone surrogate ({m.group()!r} at character {m.start()}): text must be "
                         "valid Unicode, where surrogates come in pairs", field=field)


def lone_surrogate(value) -> tuple[str, str] | None:
    """Where in parsed JSON (dicts, lists, strings) a text or a key holds a lone surrogate: (where,
    e.g. "messages[0].content" or "a field name in the body"; the top-level key it is under, or
    "body"), else None."""
    stack = [(value, "", None)]
    while stack:
        node, path, top = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, item in items:
            where = f"{path}.{key}" if isinstance(key, str) and path else key if isinstance(key, str) else f"{path}[{key}]"
            if isinstance(key, str) and _SURROGATE.search(key):
                return f"a field name in {path or 'the body'}", top or "body"
            if isinstance(item, str) and _SURROGATE.search(item):
                return where, top or where
            stack.append((item, where, top or where))
    return None


# ---------------------------------------------------------------- a model server (--engine-url)

class ServerError(TokenLabError):
    """The model server could not serve a request; the message names the server and why."""


class ServerUnreachable(ServerError):
    """Nothing answers at the server's address (refused, unknown host, connection broken)."""


class ServerTimeout(ServerError):
    """The server accepted the connection but did not answer in time."""


class ServerRefused(ServerError):
    """The server answered with an error (HTTP 4xx/5xx, or an error in the stream)."""


class ModelNotServed(ServerRefused):
    """The server does not serve the model asked for."""


class ContextTooLong(ServerRefused, InputError):
    """The prompt (and the tokens asked for) do not fit the served model's context window."""


class NotAvailable(TokenLabError):
    """What an engine cannot compute (contract.Capabilities says so beforehand): the model's
    insides (weights, activations, full logits) in front of a server, or a server's own load
    for the local engine."""
