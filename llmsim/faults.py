"""The ``x-llmsim-fault`` request header: which protocol faults one response gets.

A client asks the native server to misbehave on one request, exactly and reproducibly,
with ``x-llmsim-fault: <fault>[; <fault>...]`` (``docs/faults.md`` lists every fault,
its frames on the wire and what a correct client does); ``--fault`` with ``--fault-rate``
gives the same faults to a share of all requests.  This module only reads the text:
a frozen :class:`FaultPlan` out, or a :class:`FaultSyntaxError` whose message names the
bad fault (the server answers it with a 400 before anything else happens).  It imports
nothing of llmsim's, so that the option checks (``llmsim.options``, the bottom layer)
can use it as well as the protocol layer.
Applying the plan is :mod:`llmsim.protocol.native.faulty`'s job.

The grammar (whitespace around ``;``, ``=``, ``,`` and ``:`` is ignored, each fault at most once)::

    rst-after=N[,code=NAME]         NAME: an RFC 9113 error code name (default CANCEL)
    goaway-after=N[,code=NAME]      with a code: abrupt (GOAWAY(NAME), then close)
    close-after=N[,mode=MODE]       MODE: fin (default), rst or close-notify
    frame-size=N                    N >= 1
    split-at=OFFSET[,OFFSET...]     increasing offsets >= 1
    coalesce=K                      K >= 2
    empty-data=K                    K >= 1
    padding=P                       0 <= P <= 255
    continuation=N                  N >= 1
    delay-headers=MS
    delay-first-token=MS
    stall=AFTER_EVENTS:MS
    ping-after=N
    settings-after=N
    window-update-storm=AFTER_EVENTS:COUNT
    bad-event=AFTER_EVENTS:KIND     KIND: bad-json, bare-data, crlf or event-line
    error-after=N[,code=STATUS]     STATUS: an HTTP error status (default 500)
    trailers=name:value[,name:value...]
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import attrs
from h2.errors import ErrorCodes

__all__ = [
    "BAD_EVENT_KINDS",
    "CLOSE_MODES",
    "FAULT_HEADER",
    "FAULT_NAMES",
    "FaultPlan",
    "FaultSyntaxError",
    "parse_faults",
]

#: The request header that carries the faults (lower case, as both parsers give names).
FAULT_HEADER = b"x-llmsim-fault"
#: How ``close-after`` closes: a FIN (over TLS without ``close_notify``), a TCP RST, or
#: ``close_notify`` then the FIN.
CLOSE_MODES = ("fin", "rst", "close-notify")
#: The malformed events ``bad-event`` can send.
BAD_EVENT_KINDS = ("bad-json", "bare-data", "crlf", "event-line")
_MAX_COUNT = 1_000_000_000
_MAX_MS = 3_600_000  # an hour: longer than any client timeout worth testing
_MAX_FRAME = 2**24 - 1  # the largest frame payload RFC 9113 allows (4.2)
_MAX_STORM = 100_000  # WINDOW_UPDATE frames in one storm (900 kB on the wire)
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
    the last; counts are of events sent.  ``None`` means the fault is not asked for.
    ``names`` are the faults asked for, in the header's order (for the metrics and log)."""

    names: tuple[str, ...] = attrs.field(default=(), eq=False)
    rst_after: int | None = None
    rst_code: int = ErrorCodes.CANCEL
    goaway_after: int | None = None
    goaway_code: int | None = None  # None: graceful (NO_ERROR, the stream completes)
    close_after: int | None = None
    close_mode: str = "fin"
    frame_size: int | None = None
    split_at: tuple[int, ...] = ()
    coalesce: int | None = None
    empty_data: int = 0
    padding: int | None = None
    continuation: int | None = None
    delay_headers_ms: int = 0
    first_token_delay_ms: int = 0
    stall_after: int | None = None
    stall_ms: int = 0
    ping_after: int | None = None
    settings_after: int | None = None
    storm_after: int | None = None
    storm_count: int = 0
    bad_event_after: int | None = None
    bad_event_kind: str = ""
    error_after: int | None = None
    error_status: int = 500
    trailers: tuple[tuple[bytes, bytes], ...] = ()


def parse_faults(text: str) -> FaultPlan:
    """The plan the header value ``text`` asks for; raises :class:`FaultSyntaxError`."""
    fields: dict[str, object] = {}
    names: list[str] = []
    for item in text.split(";"):
        fault = item.strip()
        name, eq, value = (part.strip() for part in fault.partition("="))
        parser = _PARSERS.get(name)
        if parser is None or not eq:
            known = ", ".join(_PARSERS)
            raise FaultSyntaxError(f"x-llmsim-fault: unknown or malformed fault {fault!r} (known faults: {known})")
        if name in names:
            raise FaultSyntaxError(f"x-llmsim-fault: fault {name!r} is given twice")
        names.append(name)
        try:
            fields.update(parser(value))
        except ValueError as exc:
            raise FaultSyntaxError(f"x-llmsim-fault: bad fault {fault!r}: {exc}") from None
    return FaultPlan(names=tuple(names), **fields)  # type: ignore[arg-type]


def _count(text: str, what: str, *, minimum: int = 0, maximum: int = _MAX_COUNT) -> int:
    text = text.strip()
    if _INT.fullmatch(text) is None or not minimum <= int(text) <= maximum:
        raise ValueError(f"{what} must be an integer from {minimum} to {maximum}, not {text!r}")
    return int(text)


def _option(value: str, syntax: str, name: str = "code") -> tuple[str, str | None]:
    """``N`` or ``N,<name>=X``: (N, X or None)."""
    count, comma, option = value.partition(",")
    if not comma:
        return count, None
    key, eq, given = (part.strip() for part in option.partition("="))
    if key != name or not eq:
        raise ValueError(f"expected {syntax}, not {value!r}")
    return count, given


def _error_code(name: str) -> int:
    try:
        return ErrorCodes[name.upper()]
    except KeyError:
        names = ", ".join(member.name for member in ErrorCodes)
        raise ValueError(f"unknown HTTP/2 error code {name!r} (one of {names})") from None


def _after_with_code(kind: str, what: str) -> Callable[[str], dict[str, object]]:
    """The parser of ``<fault>-after=N[,code=NAME]``: fields ``<kind>_after`` and ``<kind>_code``."""

    def parse(value: str) -> dict[str, object]:
        count, code = _option(value, f"{kind}-after=N,code=NAME")
        fields: dict[str, object] = {f"{kind}_after": _count(count, f"N (events before the {what})")}
        if code is not None:
            fields[f"{kind}_code"] = _error_code(code)
        return fields

    return parse


def _close_after(value: str) -> dict[str, object]:
    count, mode = _option(value, "close-after=N,mode=MODE", "mode")
    fields: dict[str, object] = {"close_after": _count(count, "N (events before the close)")}
    if mode is not None:
        if mode not in CLOSE_MODES:
            raise ValueError(f"MODE must be one of {', '.join(CLOSE_MODES)}, not {mode!r}")
        fields["close_mode"] = mode
    return fields


def _error_after(value: str) -> dict[str, object]:
    count, code = _option(value, "error-after=N,code=STATUS")
    fields: dict[str, object] = {"error_after": _count(count, "N (events before the error event)")}
    if code is not None:
        fields["error_status"] = _count(code, "STATUS", minimum=400, maximum=599)
    return fields


def _pair(value: str, syntax: str) -> tuple[str, str]:
    first, colon, second = value.partition(":")
    if not colon:
        raise ValueError(f"expected {syntax}, not {value!r}")
    return first, second.strip()


def _stall(value: str) -> dict[str, object]:
    after, ms = _pair(value, "stall=AFTER_EVENTS:MS")
    return {"stall_after": _count(after, "AFTER_EVENTS"), "stall_ms": _count(ms, "MS", maximum=_MAX_MS)}


def _storm(value: str) -> dict[str, object]:
    after, count = _pair(value, "window-update-storm=AFTER_EVENTS:COUNT")
    return {
        "storm_after": _count(after, "AFTER_EVENTS"),
        "storm_count": _count(count, "COUNT", minimum=1, maximum=_MAX_STORM),
    }


def _bad_event(value: str) -> dict[str, object]:
    after, kind = _pair(value, "bad-event=AFTER_EVENTS:KIND")
    if kind not in BAD_EVENT_KINDS:
        raise ValueError(f"KIND must be one of {', '.join(BAD_EVENT_KINDS)}, not {kind!r}")
    return {"bad_event_after": _count(after, "AFTER_EVENTS"), "bad_event_kind": kind}


def _split_at(value: str) -> dict[str, object]:
    offsets = tuple(_count(part, "OFFSET", minimum=1) for part in value.split(","))
    if any(later <= earlier for earlier, later in itertools.pairwise(offsets)):
        raise ValueError(f"the offsets must increase, not {value!r}")
    return {"split_at": offsets}


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
    "rst-after": _after_with_code("rst", "reset"),
    "goaway-after": _after_with_code("goaway", "GOAWAY"),
    "close-after": _close_after,
    "frame-size": lambda v: {"frame_size": _count(v, "N (bytes per frame)", minimum=1, maximum=_MAX_FRAME)},
    "split-at": _split_at,
    "coalesce": lambda v: {"coalesce": _count(v, "K (events per frame)", minimum=2)},
    "empty-data": lambda v: {"empty_data": _count(v, "K (empty DATA frames per event)", minimum=1, maximum=1000)},
    "padding": lambda v: {"padding": _count(v, "P (padding bytes)", maximum=255)},
    "continuation": lambda v: {"continuation": _count(v, "N (header block bytes per frame)", minimum=1)},
    "delay-headers": lambda v: {"delay_headers_ms": _count(v, "MS", maximum=_MAX_MS)},
    "delay-first-token": lambda v: {"first_token_delay_ms": _count(v, "MS", maximum=_MAX_MS)},
    "stall": _stall,
    "ping-after": lambda v: {"ping_after": _count(v, "N (events before the PING)")},
    "settings-after": lambda v: {"settings_after": _count(v, "N (events before the SETTINGS)")},
    "window-update-storm": _storm,
    "bad-event": _bad_event,
    "error-after": _error_after,
    "trailers": _trailers,
}
#: Every fault's name, in the order of the catalogue (``docs/faults.md``).
FAULT_NAMES: tuple[str, ...] = tuple(_PARSERS)
