"""Telling TLS, HTTP/2 prior knowledge and HTTP/1.1 apart on one port.

Every protocol announces itself in its first bytes: a TLS record starts with the
handshake content type (0x16), an HTTP/2 client with the fixed connection preface
(RFC 9113 section 3.4), and anything else is taken for HTTP/1.1.  The bytes read to
decide are handed back to whoever parses the connection next.

When TLS is configured the port speaks only TLS (unless ``allow_cleartext``): a
cleartext client gets :func:`cleartext_refusal` and is closed, so that TLS can be
enforced by the one port a load test is pointed at.
"""

from __future__ import annotations

import enum

import attrs
import trio
from hyperframe.frame import GoAwayFrame, SettingsFrame

from llmsim.api.http import JSON_HEADERS, error_body

__all__ = [
    "H2_PREFACE",
    "RECEIVE_SIZE",
    "PrefixedStream",
    "Wire",
    "WrappedStream",
    "cleartext_refusal",
    "refuse_cleartext",
    "sniff",
]

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TLS_HANDSHAKE_RECORD = 0x16
RECEIVE_SIZE = 64 * 1024
_PROTOCOL_ERROR = 0x1  # RFC 9113 section 7
_TLS_ONLY = "this port serves HTTPS only: connect with TLS (the server runs without --allow-cleartext)"


class Wire(enum.Enum):
    """What the first bytes of a connection say it speaks."""

    CLOSED = "closed"  # EOF or reset before a single byte
    TLS = "tls"
    H2 = "h2"  # the HTTP/2 connection preface
    HTTP1 = "http/1.1"


def classify(prefix: bytes, *, tls_possible: bool) -> Wire | None:
    """The wire protocol ``prefix`` announces, or None if more bytes are needed."""
    if not prefix:
        return None
    if tls_possible and prefix[0] == TLS_HANDSHAKE_RECORD:
        return Wire.TLS
    if len(prefix) >= len(H2_PREFACE):
        return Wire.H2 if prefix.startswith(H2_PREFACE) else Wire.HTTP1
    return None if H2_PREFACE.startswith(prefix) else Wire.HTTP1


async def sniff(stream: trio.abc.ReceiveStream, *, tls_possible: bool) -> tuple[Wire, bytes]:
    """Read just enough of ``stream`` to classify it; returns the kind and the bytes read.

    A connection that closes mid-preface is HTTP/1.1 (whatever it sent is garbage
    there too); one that closes before its first byte is :attr:`Wire.CLOSED`.
    """
    prefix = b""
    while True:
        try:
            data = await stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            return (Wire.HTTP1 if prefix else Wire.CLOSED), prefix
        prefix += data
        wire = classify(prefix, tls_possible=tls_possible)
        if wire is not None:
            return wire, prefix


@attrs.define(eq=False)
class WrappedStream(trio.abc.HalfCloseableStream):
    """``stream`` with everything passed through: a base for wrappers that change how
    it is read."""

    stream: trio.abc.HalfCloseableStream

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


@attrs.define(eq=False)
class PrefixedStream(WrappedStream):
    """``stream`` with ``prefix`` put back in front of what it receives.

    Lets :class:`trio.SSLStream` read a ClientHello that :func:`sniff` already consumed.
    """

    prefix: bytes

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if not self.prefix:
            return await self.stream.receive_some(max_bytes)
        await trio.lowlevel.checkpoint()
        size = len(self.prefix) if max_bytes is None else max_bytes
        data, self.prefix = self.prefix[:size], self.prefix[size:]
        return data


def cleartext_refusal(wire: Wire) -> bytes:
    """What a cleartext client hears on a TLS-only port before the server closes.

    HTTP/1.1: a 400 in the error envelope (as nginx answers "The plain HTTP request was
    sent to HTTPS port"); h2c: the server preface (an empty SETTINGS) and a GOAWAY
    with PROTOCOL_ERROR and the same message as debug data.
    """
    if wire is Wire.H2:
        goaway = GoAwayFrame(stream_id=0, last_stream_id=0, error_code=_PROTOCOL_ERROR)
        goaway.additional_data = _TLS_ONLY.encode()
        return SettingsFrame(0).serialize() + goaway.serialize()
    body = error_body(400, _TLS_ONLY)
    headers = (*JSON_HEADERS, (b"content-length", b"%d" % len(body)), (b"connection", b"close"))
    head = b"HTTP/1.1 400 Bad Request\r\n" + b"".join(b"%b: %b\r\n" % field for field in headers)
    return head + b"\r\n" + body


async def refuse_cleartext(stream: trio.abc.HalfCloseableStream, wire: Wire, linger: float) -> None:
    """Send :func:`cleartext_refusal`, half-close, and give the peer ``linger`` seconds
    to read it and close (so that its unread request does not turn our close into a reset)."""
    try:
        await stream.send_all(cleartext_refusal(wire))
        await stream.send_eof()
        with trio.move_on_after(linger):
            while await stream.receive_some(RECEIVE_SIZE):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
