"""Telling TLS, HTTP/2 prior knowledge and HTTP/1.1 apart on one port.

Every protocol announces itself in its first bytes: a TLS record starts with the
handshake content type (0x16), an HTTP/2 client with the fixed connection preface
(RFC 9113 section 3.4), and anything else is taken for HTTP/1.1.  The bytes read to
decide are handed back to whoever parses the connection next.
"""

from __future__ import annotations

import enum

import attrs
import trio

__all__ = ["H2_PREFACE", "RECEIVE_SIZE", "PrefixedStream", "Wire", "sniff"]

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TLS_HANDSHAKE_RECORD = 0x16
RECEIVE_SIZE = 64 * 1024


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
class PrefixedStream(trio.abc.HalfCloseableStream):
    """``stream`` with ``prefix`` put back in front of what it receives.

    Lets :class:`trio.SSLStream` read a ClientHello that :func:`sniff` already consumed.
    """

    stream: trio.abc.HalfCloseableStream
    prefix: bytes

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if not self.prefix:
            return await self.stream.receive_some(max_bytes)
        await trio.lowlevel.checkpoint()
        size = len(self.prefix) if max_bytes is None else max_bytes
        data, self.prefix = self.prefix[:size], self.prefix[size:]
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()
