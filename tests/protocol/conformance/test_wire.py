"""The conformance client's verdicts against a scripted server: each of h2spec's
``Verify*`` outcomes passes what h2spec passes and fails what it fails."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from tests.protocol.conformance.wire import (
    ACK,
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_CONCURRENT_STREAMS,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    Mismatch,
    Peer,
    frame,
    settings_payload,
)

Script = list[bytes | None]  # frames the server sends, in order; None: it closes the connection


def goaway(code: int) -> bytes:
    return frame(GOAWAY, 0, 0, bytes(4) + code.to_bytes(4, "big"))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


RESPONSE_HEAD = frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x88")  # :status 200, and the stream ends


async def against(script: Script, verdict: Callable[[Peer], Awaitable[None]]) -> Peer:
    """Run ``verdict`` on a Peer whose server sends ``script`` and then stays silent."""
    client, server = trio.testing.memory_stream_pair()
    peer = Peer(client, authority="test", path="/")
    for data in script:
        if data is None:
            await server.aclose()
            break
        await server.send_all(data)
    await verdict(peer)
    return peer


async def test_handshake_records_the_server_settings_and_acknowledges_them() -> None:
    client, server = trio.testing.memory_stream_pair()
    peer = Peer(client, authority="test", path="/")
    await server.send_all(
        frame(SETTINGS, 0, 0, settings_payload((MAX_CONCURRENT_STREAMS, 7))) + frame(SETTINGS, ACK, 0, b"")
    )
    await peer.handshake()
    assert peer.server_settings == {MAX_CONCURRENT_STREAMS: 7}
    sent = await server.receive_some()
    assert sent.startswith(PREFACE) and sent.endswith(frame(SETTINGS, ACK, 0, b""))


@pytest.mark.parametrize(
    ("script", "other_codes"),
    [
        ([goaway(PROTOCOL_ERROR)], []),
        ([None], []),
        ([RESPONSE_HEAD, None], []),
        # h2spec reads on past a GOAWAY with another code, and passes on the close
        ([goaway(COMPRESSION_ERROR), None], ["GOAWAY COMPRESSION_ERROR (PROTOCOL_ERROR expected)"]),
    ],
)
async def test_connection_error_passes_on_its_goaway_or_a_close(script: Script, other_codes: list[str]) -> None:
    peer = await against(script, lambda p: p.expect_connection_error(PROTOCOL_ERROR))
    assert peer.other_codes == other_codes


@pytest.mark.parametrize(
    ("script", "actual"),
    [
        ([RESPONSE_HEAD], "HEADERS (length:1, flags:0x05, stream_id:1), then nothing within"),
        (
            [rst_stream(1, PROTOCOL_ERROR)],
            "RST_STREAM PROTOCOL_ERROR (length:4, flags:0x00, stream_id:1), then nothing",
        ),
        ([goaway(COMPRESSION_ERROR)], "GOAWAY COMPRESSION_ERROR (length:8, flags:0x00, stream_id:0), then nothing"),
    ],
)
async def test_connection_error_fails_on_anything_else(
    script: Script, actual: str, autojump_clock: trio.testing.MockClock
) -> None:
    with pytest.raises(Mismatch) as failure:
        await against(script, lambda p: p.expect_connection_error(PROTOCOL_ERROR))
    assert failure.value.actual.startswith(actual)


@pytest.mark.parametrize("script", [[rst_stream(1, STREAM_CLOSED)], [goaway(PROTOCOL_ERROR)], [None]])
async def test_stream_error_passes_on_its_reset_its_goaway_or_a_close(script: Script) -> None:
    await against(script, lambda p: p.expect_stream_error(STREAM_CLOSED, PROTOCOL_ERROR))


async def test_stream_error_fails_on_a_normal_response(autojump_clock: trio.testing.MockClock) -> None:
    with pytest.raises(Mismatch, match="HEADERS"):
        await against([RESPONSE_HEAD], lambda p: p.expect_stream_error(PROTOCOL_ERROR))


async def test_headers_must_come_on_the_stream_asked_for() -> None:
    await against([frame(PING, ACK, 0, bytes(8)), RESPONSE_HEAD], lambda p: p.expect_headers(1))
    with pytest.raises(Mismatch, match="stream_id:3"):
        await against([frame(HEADERS, END_HEADERS, 3, b"\x88")], lambda p: p.expect_headers(1))
    with pytest.raises(Mismatch, match="connection closed"):
        await against([None], lambda p: p.expect_headers(1))


async def test_ping_ack_or_close() -> None:
    await against([None], lambda p: p.expect_ping_ack_or_close())
    await against([frame(PING, ACK, 0, bytes(8))], lambda p: p.expect_ping_ack_or_close())
    with pytest.raises(Mismatch, match="PING"):
        await against([frame(PING, ACK, 0, b"other\x00\x00\x00")], lambda p: p.expect_ping_ack_or_close())
    with pytest.raises(Mismatch, match="PING"):
        await against([frame(PING, 0, 0, bytes(8))], lambda p: p.expect_ping_ack())


async def test_a_frame_split_across_reads_is_read_whole() -> None:
    client, server = trio.testing.memory_stream_pair()
    peer = Peer(client, authority="test", path="/")
    data = goaway(PROTOCOL_ERROR)

    async def trickle() -> None:
        for octet in data:
            await server.send_all(bytes((octet,)))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        assert str(await peer.next_event()).startswith("GOAWAY PROTOCOL_ERROR")
