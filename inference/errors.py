"""Errors a user can cause. Each carries a one-line message meant to be shown as is."""


class TokenLabError(Exception):
    """Base class: the message is complete and needs no traceback."""


class ModelError(TokenLabError):
    """A model directory or file that cannot be loaded."""


class InputError(TokenLabError):
    """A prompt or sampling setting that cannot be used."""


class ResourceError(TokenLabError):
    """The device ran out of memory during a run; the run ended, the engine keeps serving."""
