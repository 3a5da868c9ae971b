"""Errors as OpenAI clients expect them: an HTTP status and {"error": {"message", "type",
"param", "code"}}. A user's bad input is a 4xx with the engine's one-line message, never a 5xx."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from inference.errors import (ContextTooLong, EngineClosed, EngineDown, InputError, ModelNotServed, NotAvailable,
                              ResourceError, ServerError, TokenLabError)
from inference.sampling.settings import BY_NAME


class APIError(Exception):
    """An answer that is an error: status, one-line message, OpenAI's type, the field at fault."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad(message: str, param: str | None = None) -> APIError:
    """400: a value the request cannot have."""
    return APIError(400, message, param=param)


def request_key(field: str | None) -> str | None:
    """A setting's name (inference.errors.InputError.field) as the request's field: the key
    vLLM's request uses for it where it has one (max_new_tokens is max_tokens)."""
    s = BY_NAME.get(field)
    return (s.server_key or s.name) if s is not None else field


def from_engine(e: TokenLabError) -> APIError:
    """The engine's one-line errors as answers: what the request asked wrongly is a 400, a model
    a server in front does not serve a 404, a server that failed a 502, a stopping engine or
    memory run out a 503."""
    if isinstance(e, ModelNotServed):
        return APIError(404, str(e), code="model_not_found", param="model")
    if isinstance(e, (InputError, ContextTooLong, NotAvailable)):
        return APIError(400, str(e), param=request_key(getattr(e, "field", None)))
    if isinstance(e, ServerError):
        return APIError(502, str(e), type="api_error", code="upstream_error")
    if isinstance(e, (EngineClosed, EngineDown, ResourceError)):
        return APIError(503, str(e), type="api_error", code="unavailable")
    return APIError(500, str(e), type="api_error")
