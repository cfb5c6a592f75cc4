"""gRPC over HTTP/2 as llmsim speaks it: message framing, status codes, status trailers,
``grpc-timeout``.  (grpc/grpc, doc/PROTOCOL-HTTP2.md: "Length-Prefixed-Message",
"Status", "Timeout"; doc/statuscodes.md.)

A message is a 1-byte compressed flag, a 4-byte big-endian length, then the protobuf
bytes.  The response is HEADERS (``:status 200``, ``content-type: application/grpc``),
the messages as DATA, then the trailers ``grpc-status`` and ``grpc-message`` (the
message percent-encoded).  llmsim supports no compression: a compressed request message
is refused with UNIMPLEMENTED.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator

from llmsim.api.http import VERSION_HEADER

__all__ = [
    "GRPC_HEADERS",
    "GrpcError",
    "StatusCode",
    "frame",
    "parse_timeout",
    "status_for_http",
    "status_trailers",
    "unframe",
]

GRPC_HEADERS: tuple[tuple[bytes, bytes], ...] = ((b"content-type", b"application/grpc"), VERSION_HEADER)
_PREFIX = struct.Struct(">BI")


class StatusCode(enum.IntEnum):
    """gRPC's status codes (doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """A call that ends with a non-OK status."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# llm-d-inference-sim's extractGRPCCode (pkg/communication/grpc.go:168-193): the HTTP
# status of an error, as the gRPC code its VllmEngine answers with; anything else UNKNOWN.
_HTTP_TO_GRPC = {
    400: StatusCode.INVALID_ARGUMENT,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.NOT_FOUND,
    409: StatusCode.ABORTED,
    429: StatusCode.RESOURCE_EXHAUSTED,
    501: StatusCode.UNIMPLEMENTED,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.DEADLINE_EXCEEDED,
    500: StatusCode.INTERNAL,
}


def status_for_http(status: int) -> StatusCode:
    """The gRPC code of an error that HTTP answers with ``status``."""
    return _HTTP_TO_GRPC.get(status, StatusCode.UNKNOWN)


def frame(message: bytes) -> bytes:
    """One uncompressed Length-Prefixed-Message."""
    return _PREFIX.pack(0, len(message)) + message


def unframe(body: bytes) -> Iterator[bytes]:
    """The messages of a request body, in order; :class:`GrpcError` for a truncated or
    compressed one."""
    offset, size = 0, len(body)
    while offset < size:
        if size - offset < _PREFIX.size:
            raise GrpcError(StatusCode.INTERNAL, "truncated gRPC message prefix")
        compressed, length = _PREFIX.unpack_from(body, offset)
        offset += _PREFIX.size
        if compressed:
            raise GrpcError(StatusCode.UNIMPLEMENTED, "compressed gRPC messages are not supported")
        if size - offset < length:
            raise GrpcError(StatusCode.INTERNAL, f"gRPC message of {length} bytes truncated to {size - offset}")
        yield body[offset : offset + length]
        offset += length


def _percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, with every byte outside 0x20-0x7E and ``%``
    written as ``%XX``."""
    return b"".join(
        bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
        for byte in message.encode("utf-8")
    )


def status_trailers(code: StatusCode, message: str = "") -> tuple[tuple[bytes, bytes], ...]:
    """The trailers that end a call with ``code`` (and ``message``, if any)."""
    status = (b"grpc-status", b"%d" % code)
    return (status, (b"grpc-message", _percent_encode(message))) if message else (status,)


# grpc-timeout: at most 8 ASCII digits and a unit (doc/PROTOCOL-HTTP2.md, "Timeout").
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str) -> float:
    """Seconds of a ``grpc-timeout`` value (``"100m"``: 0.1); ValueError if malformed."""
    digits, unit = value[:-1], value[-1:]
    if unit not in _UNITS or not digits.isascii() or not digits.isdigit() or len(digits) > 8:
        raise ValueError(f"malformed grpc-timeout {value!r}")
    return int(digits) * _UNITS[unit]
