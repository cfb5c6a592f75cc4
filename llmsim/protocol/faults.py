"""The ``x-llmsim-fault`` request header: which protocol faults one response gets.

A client asks the native server to misbehave on one request, exactly and reproducibly,
with ``x-llmsim-fault: <fault>[; <fault>...]`` (``docs/faults.md`` lists every fault,
its frames on the wire and what a correct client does).  This module only reads the
header: text in, a frozen :class:`FaultPlan` out, or a :class:`FaultSyntaxError` whose
message names the bad fault (the server answers it with a 400 before anything else
happens).  Applying the plan is :mod:`llmsim.protocol.native.faulty`'s job.

The grammar (whitespace around ``;`` and ``=`` is ignored, each fault at most once)::

    rst-after=N[,code=NAME]     NAME: an RFC 9113 error code name (default CANCEL)
    goaway-after=N
    close-after=N
    frame-size=N                N >= 1
    delay-headers=MS
    stall=AFTER_EVENTS:MS
    trailers=name:value[,name:value...]
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs
from h2.errors import ErrorCodes

__all__ = ["FAULT_HEADER", "FaultPlan", "FaultSyntaxError", "parse_faults"]

#: The request header that carries the faults (lower case, as both parsers give names).
FAULT_HEADER = b"x-llmsim-fault"
_MAX_COUNT = 1_000_000_000
_MAX_MS = 3_600_000  # an hour: longer than any client timeout worth testing
_MAX_FRAME = 2**24 - 1  # the largest frame payload RFC 9113 allows (4.2)
_INT = re.compile(r"[0-9]{1,10}")
#: An RFC 9110 field name (token), and a value without CR, LF, NUL or a comma.
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
_FIELD_VALUE = re.compile(r"[^\x00\r\n,]*")
#: Fields a trailer section must not carry (RFC 9110 6.5.1, RFC 9113 8.2.2).
_FORBIDDEN_TRAILERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "te", "upgrade", "trailer", "host"}
)


class FaultSyntaxError(ValueError):
    """The ``x-llmsim-fault`` header is malformed; the message names the bad fault."""


@attrs.frozen
class FaultPlan:
    """The faults of one response.  An *event* is one non-empty ``write`` of the response
    body by the handler (one SSE event group), the non-empty data of its ``end`` being
    the last; counts are of events sent.  ``None`` means the fault is not asked for."""

    rst_after: int | None = None
    rst_code: int = ErrorCodes.CANCEL
    goaway_after: int | None = None
    close_after: int | None = None
    frame_size: int | None = None
    delay_headers_ms: int = 0
    stall_after: int | None = None
    stall_ms: int = 0
    trailers: tuple[tuple[bytes, bytes], ...] = ()


def parse_faults(text: str) -> FaultPlan:
    """The plan the header value ``text`` asks for; raises :class:`FaultSyntaxError`."""
    fields: dict[str, object] = {}
    seen: set[str] = set()
    for item in text.split(";"):
        fault = item.strip()
        name, eq, value = (part.strip() for part in fault.partition("="))
        parser = _PARSERS.get(name)
        if parser is None or not eq:
            known = ", ".join(_PARSERS)
            raise FaultSyntaxError(f"x-llmsim-fault: unknown or malformed fault {fault!r} (known faults: {known})")
        if name in seen:
            raise FaultSyntaxError(f"x-llmsim-fault: fault {name!r} is given twice")
        seen.add(name)
        try:
            fields.update(parser(value))
        except ValueError as exc:
            raise FaultSyntaxError(f"x-llmsim-fault: bad fault {fault!r}: {exc}") from None
    return FaultPlan(**fields)  # type: ignore[arg-type]


def _count(text: str, what: str, *, minimum: int = 0, maximum: int = _MAX_COUNT) -> int:
    text = text.strip()
    if _INT.fullmatch(text) is None or not minimum <= int(text) <= maximum:
        raise ValueError(f"{what} must be an integer from {minimum} to {maximum}, not {text!r}")
    return int(text)


def _rst_after(value: str) -> dict[str, object]:
    count, comma, option = value.partition(",")
    fields: dict[str, object] = {"rst_after": _count(count, "N (events before the reset)")}
    if comma:
        key, eq, code = (part.strip() for part in option.partition("="))
        if key != "code" or not eq:
            raise ValueError(f"expected rst-after=N,code=NAME, not {value!r}")
        try:
            fields["rst_code"] = ErrorCodes[code.upper()]
        except KeyError:
            names = ", ".join(member.name for member in ErrorCodes)
            raise ValueError(f"unknown HTTP/2 error code {code!r} (one of {names})") from None
    return fields


def _stall(value: str) -> dict[str, object]:
    after, colon, ms = value.partition(":")
    if not colon:
        raise ValueError(f"expected stall=AFTER_EVENTS:MS, not {value!r}")
    return {"stall_after": _count(after, "AFTER_EVENTS"), "stall_ms": _count(ms, "MS", maximum=_MAX_MS)}


def _trailers(value: str) -> dict[str, object]:
    trailers = []
    for pair in value.split(","):
        name, colon, field_value = pair.partition(":")
        name, field_value = name.strip().lower(), field_value.strip()
        if not colon or _FIELD_NAME.fullmatch(name) is None or _FIELD_VALUE.fullmatch(field_value) is None:
            raise ValueError(f"expected trailers=name:value[,name:value...], not {pair.strip()!r}")
        if name in _FORBIDDEN_TRAILERS:
            raise ValueError(f"{name!r} is not allowed in trailers")
        trailers.append((name.encode("ascii"), field_value.encode("latin-1")))
    return {"trailers": tuple(trailers)}


_PARSERS: dict[str, Callable[[str], dict[str, object]]] = {
    "rst-after": _rst_after,
    "goaway-after": lambda v: {"goaway_after": _count(v, "N (events before the GOAWAY)")},
    "close-after": lambda v: {"close_after": _count(v, "N (events before the close)")},
    "frame-size": lambda v: {"frame_size": _count(v, "N (bytes per frame)", minimum=1, maximum=_MAX_FRAME)},
    "delay-headers": lambda v: {"delay_headers_ms": _count(v, "MS", maximum=_MAX_MS)},
    "stall": _stall,
    "trailers": _trailers,
}
