"""The error envelope, in vLLM's (OpenAI) shape and in Anthropic's.

OpenAI/vLLM: ``{"error": {"message", "type", "param", "code"}}`` with ``code`` the
integer HTTP status (vLLM >= 0.10.1).  Anthropic: ``{"type": "error", "error":
{"type", "message"}}``.  Every client-caused failure is an :class:`ApiError`; the
router turns it into one of these bodies, so nothing a client sends becomes a 500.
The OpenAI body (:func:`error_body`) is defined in the seam, :mod:`llmsim.api.http`,
because the protocol layer answers its own errors in it too.
"""

from __future__ import annotations

import orjson

from llmsim.api.http import JSON_HEADERS, error_body, openai_error_type

__all__ = [
    "JSON_HEADERS",
    "ApiError",
    "ResponseClosed",
    "anthropic_error_body",
    "anthropic_error_type",
    "error_body",
    "openai_error_type",
    "validation_error",
]

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",  # vLLM's queue overflow (vllm/entrypoints/anthropic/protocol.py:42-43)
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    if status >= 500 and status not in _ANTHROPIC_TYPES:
        return "api_error"
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error")


class ResponseClosed(Exception):
    """The client went away before the response was made: there is nothing to answer.
    (``generation.PendingJobs.finished`` raises it; ``Api`` lets the handler end quietly.)"""


class ApiError(Exception):
    """A request that cannot be served, with the status and message the client sees."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        error_type: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type or openai_error_type(status)
        self.headers = headers

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, param={self.param!r})"

    def body(self) -> bytes:
        return error_body(self.status, self.message, param=self.param, error_type=self.error_type)

    def anthropic_body(self) -> bytes:
        return anthropic_error_body(self.status, self.message)

    def as_dict(self) -> dict[str, object]:
        return {"message": self.message, "type": self.error_type, "param": self.param, "code": self.status}


def anthropic_error_body(status: int, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})


def validation_error(message: str, *, parameter: str | None = None, value: object = None) -> ApiError:
    """vLLM's ``VLLMValidationError`` as the client sees it: a 400 whose ``param`` is
    ``parameter`` and whose message ends with `` (parameter=..., value=...)``, each part
    only when set (``vllm/exceptions.py:28-56``, ``error_response.py:43-46``)."""
    extras = []
    if parameter is not None:
        extras.append(f"parameter={parameter}")
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return ApiError(400, text, param=parameter)
