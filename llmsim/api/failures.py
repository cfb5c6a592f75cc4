"""Injected failures: llm-d-inference-sim's ``--failure-injection-rate`` and
``--failure-types``, and its ``X-Return-Error: <status>`` request header.

Every generation endpoint calls :func:`check_injected_failure` once, right after its
body is parsed and before the model is checked, where llm-d-inference-sim decides them
(``pkg/communication/http.go:223-255``: the body, then the header;
``pkg/llm-d-inference-sim/simulator.go:353-364``: the roll, then the model).  Nothing
has reached the engine or the wire yet, so a stream gets the real status, and the
engine's counters (and so ``/metrics``) never see the request.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from types import MappingProxyType

import attrs
import orjson

from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.options import FAILURE_TYPES, ControlOptions

__all__ = ["FAILURES", "Failure", "check_injected_failure", "injected_failure", "return_error"]


@attrs.frozen
class Failure:
    """One predefined failure; ``{model}`` in the message is the ``--model`` name."""

    status: int
    message: str
    param: str | None = None

    def error(self, model: str) -> ApiError:
        return ApiError(
            self.status, self.message.format(model=model), param=self.param, error_type=llmd_error_type(self.status)
        )


# pkg/llm-d-inference-sim/failures.go:26-44 (the model is its Config.Model, our --model)
FAILURES: Mapping[str, Failure] = MappingProxyType(
    {
        "rate_limit": Failure(
            429,
            "Rate limit reached for {model} in organization org-xxx on requests per min (RPM): "
            "Limit 3, Used 3, Requested 1.",
        ),
        "invalid_api_key": Failure(401, "Incorrect API key provided."),
        "context_length": Failure(
            400,
            "This model's maximum context length is 4096 tokens. However, your messages resulted in 4500 tokens.",
            "messages",
        ),
        "server_error": Failure(503, "The server is overloaded or not ready yet."),
        "invalid_request": Failure(400, "Invalid request: missing required parameter 'model'.", "model"),
        "model_not_found": Failure(404, "The model '{model}-nonexistent' does not exist", "model"),
    }
)
# What Go's strconv.Atoi accepts (an optional sign, ASCII digits).
_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")  # Atoi's int64 range is checked by the status range
# The statuses X-Return-Error may ask for: errors only.  llm-d-inference-sim sends any
# integer as the status line; a 1xx, 204 or 304 cannot carry the error body at all.
_ERROR_STATUSES = range(400, 600)

# pkg/api/response.go:381-404 (ErrorCodeToType)
_LLMD_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
}


def llmd_error_type(status: int) -> str:
    """The ``type`` llm-d-inference-sim gives an error of ``status``."""
    if status >= 500:
        return "InternalServerError"
    return _LLMD_TYPES.get(status, "APIConnectionError")


def check_injected_failure(call: Call) -> None:
    """Raise what llm-d-inference-sim answers this generation request with before looking
    at its model: the ``X-Return-Error`` status, or a failure injected at
    ``--failure-injection-rate`` percent.  Returns when neither applies."""
    value = call.request.header("x-return-error")
    if value:  # llm-d ignores an empty value
        raise return_error(value)
    ctx = call.ctx
    control = ctx.control
    if not control.failure_injection_rate:  # the usual server: no roll (injected_failure's first test, uncalled)
        return
    error = injected_failure(control, ctx.failure_rng, ctx.model.name)
    if error is not None:
        raise error


def injected_failure(control: ControlOptions, rng: random.Random, model: str) -> ApiError | None:
    """One roll of the dice (pkg/llm-d-inference-sim/failures.go:46-84): a failure of one
    of ``control.failure_types`` (all when empty), picked uniformly, in
    ``failure_injection_rate`` percent of the calls.  ``control`` is read by the caller
    once per request: ``POST /admin/config`` replaces it while the server runs."""
    rate = control.failure_injection_rate
    if rate == 0 or rng.randint(1, 100) > rate:
        return None
    # llm-d picks from Go map order when no types are given; here the listed order, so
    # that the pick is reproducible too.
    name = rng.choice(control.failure_types or FAILURE_TYPES)
    return FAILURES[name].error(model)


def return_error(value: str) -> ApiError:
    """The error asked for by ``X-Return-Error: value`` (pkg/communication/http.go:240-254)."""
    if not _INTEGER.fullmatch(value):
        message = f"Invalid X-Return-Error header value {_go_quote(value)}: must be an integer"
        return ApiError(400, message, error_type=llmd_error_type(400))
    status = int(value)
    if status not in _ERROR_STATUSES:
        message = f"Invalid X-Return-Error header value {_go_quote(value)}: must be an error status (400-599)"
        return ApiError(400, message, error_type=llmd_error_type(400))
    message = f"Simulated error triggered by X-Return-Error header (code {status})"
    return ApiError(status, message, error_type=llmd_error_type(status))


def _go_quote(value: str) -> str:
    """Go's ``%q`` of the header value, for every value HTTP lets through: JSON's quoting
    with non-ASCII text kept (the header arrives as latin-1 bytes, read as UTF-8)."""
    text = value.encode("latin-1").decode("utf-8", "replace")
    return orjson.dumps(text).decode()
