"""Telling TLS, the HTTP/2 preface and HTTP/1.1 apart by their first bytes."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llmsim.protocol.native.detect import H2_PREFACE, PrefixedStream, Wire, classify, sniff


@pytest.mark.parametrize(
    ("prefix", "tls_possible", "expected"),
    [
        (b"\x16\x03\x01\x02\x00", True, Wire.TLS),
        (b"\x16\x03\x01\x02\x00", False, Wire.HTTP1),
        (H2_PREFACE + b"\x00\x00", True, Wire.H2),
        (H2_PREFACE[:10], True, None),
        (b"", True, None),
        (b"GET / HTTP/1.1\r\n", True, Wire.HTTP1),
        (b"PRI * HTTP/1.1\r\n", False, Wire.HTTP1),
        (b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", False, Wire.HTTP1),
    ],
)
def test_classify(prefix: bytes, tls_possible: bool, expected: Wire | None) -> None:
    assert classify(prefix, tls_possible=tls_possible) is expected


async def test_sniff_reads_a_split_preface_and_returns_every_byte_it_read() -> None:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:

        async def send_in_pieces() -> None:
            for piece in (H2_PREFACE[:5], H2_PREFACE[5:20], H2_PREFACE[20:] + b"frames"):
                await client.send_all(piece)
                await trio.testing.wait_all_tasks_blocked()

        nursery.start_soon(send_in_pieces)
        assert await sniff(server, tls_possible=True) == (Wire.H2, H2_PREFACE + b"frames")


async def test_sniff_reports_a_connection_closed_before_its_first_byte() -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.aclose()
    assert await sniff(server, tls_possible=True) == (Wire.CLOSED, b"")


async def test_prefixed_stream_returns_the_prefix_first() -> None:
    client, server = trio.testing.memory_stream_pair()
    stream = PrefixedStream(server, b"abcdef")
    await client.send_all(b"rest")
    assert await stream.receive_some(4) == b"abcd"
    assert await stream.receive_some() == b"ef"
    assert await stream.receive_some() == b"rest"
    await stream.send_all(b"out")
    assert await client.receive_some() == b"out"
