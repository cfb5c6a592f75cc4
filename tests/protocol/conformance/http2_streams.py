"""h2spec's ``http2`` cases for RFC 7540 sections 3 to 5: the preface, frame format and size,
header compression, stream states and identifiers, concurrency, priority, error handling
and extensions (``http2/3_5_*.go`` to ``http2/5_5_*.go`` in summerwind/h2spec)."""

from __future__ import annotations

from tests.protocol.conformance.case import Catalogue
from tests.protocol.conformance.wire import (
    CANCEL,
    COMPRESSION_ERROR,
    DEFAULT_WINDOW,
    FRAME_SIZE_ERROR,
    GOAWAY,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    Field,
    Frame,
    Mismatch,
    Peer,
    priority_payload,
)

HTTP2 = Catalogue("http2")
case = HTTP2.case

MAX_HEADER_LEN = 4000  # h2spec's --max-header-length default
UNKNOWN_FRAME = b"\x00\x00\x08\x16\x00\x00\x00\x00\x00" + bytes(8)  # type 0x16, 8 octets, stream 0


def dummy_headers(count: int) -> list[Field]:
    """h2spec's ``DummyHeaders``: ``count`` fields of ``MAX_HEADER_LEN`` octets each."""
    return [(f"x-dummy{i}", "x" * MAX_HEADER_LEN) for i in range(count)]


def max_frame_size(peer: Peer) -> int:
    return peer.server_settings.get(MAX_FRAME_SIZE, 16384)


# --- 3.5 HTTP/2 Connection Preface ------------------------------------------------------


@case("3.5", "Sends client connection preface")
async def preface(p: Peer) -> None:
    await p.send(PREFACE)
    await p.settings((INITIAL_WINDOW_SIZE, DEFAULT_WINDOW))
    event = await p.next_event()
    if not (isinstance(event, Frame) and event.type == SETTINGS and not event.flags):
        raise Mismatch("SETTINGS (flags:0x00) as the first frame", str(event))


@case("3.5", "Sends invalid connection preface")
async def invalid_preface(p: Peer) -> None:
    await p.send(b"INVALID CONNECTION PREFACE\r\n\r\n")
    await p.expect_connection_error(PROTOCOL_ERROR)


# --- 4.1 Frame Format --------------------------------------------------------------------


@case("4.1", "Sends a frame with unknown type")
async def unknown_type(p: Peer) -> None:
    await p.handshake()
    await p.send(UNKNOWN_FRAME)
    await p.ping()
    await p.expect_ping_ack()


@case("4.1", "Sends a frame with undefined flag")
async def undefined_flag(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x08\x06\x16\x00\x00\x00\x00" + bytes(8))  # PING, flags 0x16
    await p.expect_frame(PING, "a PING frame", lambda f: True)


@case("4.1", "Sends a frame with reserved field bit")
async def reserved_bit(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x08\x06\x16\x80\x00\x00\x00" + bytes(8))  # PING, R bit set
    await p.expect_frame(PING, "a PING frame", lambda f: True)


# --- 4.2 Frame Size ----------------------------------------------------------------------


@case("4.2", "Sends a DATA frame with 2^14 octets in length")
async def data_max_size(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"x" * max_frame_size(p))
    await p.expect_headers(1)


@case("4.2", "Sends a large size DATA frame that exceeds the SETTINGS_MAX_FRAME_SIZE")
async def data_too_large(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"x" * (max_frame_size(p) + 1))
    await p.expect_stream_error(FRAME_SIZE_ERROR)


@case("4.2", "Sends a large size HEADERS frame that exceeds the SETTINGS_MAX_FRAME_SIZE")
async def headers_too_large(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request() + dummy_headers(5)))
    await p.expect_connection_error(FRAME_SIZE_ERROR)


# --- 4.3 Header Compression and Decompression -------------------------------------------


@case("4.3", "Sends invalid header block fragment")
async def invalid_block(p: Peer) -> None:
    await p.handshake()
    # a literal with incremental indexing, without its length and string
    await p.send(b"\x00\x00\x01\x01\x05\x00\x00\x00\x01\x40")
    await p.expect_connection_error(COMPRESSION_ERROR)


@case("4.3", "Sends a PRIORITY frame while sending the header blocks")
async def priority_inside_block(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False, end_headers=False)
    await p.priority(1, 0, 255)
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("4.3", "Sends a HEADERS frame to another stream while sending the header blocks")
async def headers_inside_block(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False, end_headers=False)
    await p.headers(3, p.encode(p.request()))
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


# --- 5.1 Stream States -------------------------------------------------------------------


@case("5.1", "idle: Sends a DATA frame")
async def idle_data(p: Peer) -> None:
    await p.handshake()
    await p.data(1, b"test")
    # h2spec: "an unclear part of the specification": 6.1 says STREAM_CLOSED
    await p.expect_stream_error(PROTOCOL_ERROR, STREAM_CLOSED)


@case("5.1", "idle: Sends a RST_STREAM frame")
async def idle_rst(p: Peer) -> None:
    await p.handshake()
    await p.rst_stream(1, CANCEL)
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("5.1", "idle: Sends a WINDOW_UPDATE frame")
async def idle_window_update(p: Peer) -> None:
    await p.handshake()
    await p.window_update(1, 100)
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("5.1", "idle: Sends a CONTINUATION frame")
async def idle_continuation(p: Peer) -> None:
    await p.handshake()
    await p.continuation(1, p.encode(p.request()))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("5.1", "half closed (remote): Sends a DATA frame")
async def half_closed_data(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.data(1, b"test")
    await p.expect_stream_error(STREAM_CLOSED)


@case("5.1", "half closed (remote): Sends a HEADERS frame")
async def half_closed_headers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.headers(1, p.encode(p.request()))
    await p.expect_stream_error(STREAM_CLOSED)


@case("5.1", "half closed (remote): Sends a CONTINUATION frame")
async def half_closed_continuation(p: Peer) -> None:
    await p.handshake()
    block = p.encode(p.request())
    await p.headers(1, block)
    await p.continuation(1, block)
    await p.expect_stream_error(STREAM_CLOSED, PROTOCOL_ERROR)


@case("5.1", "closed: Sends a DATA frame after sending RST_STREAM frame")
async def reset_data(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False)
    await p.rst_stream(1, CANCEL)
    await p.data(1, b"test")
    await p.expect_stream_error(STREAM_CLOSED)


@case("5.1", "closed: Sends a HEADERS frame after sending RST_STREAM frame")
async def reset_headers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False)
    await p.rst_stream(1, CANCEL)
    await p.headers(1, p.encode(p.request()))
    await p.expect_stream_error(STREAM_CLOSED)


@case("5.1", "closed: Sends a CONTINUATION frame after sending RST_STREAM frame")
async def reset_continuation(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False)
    await p.rst_stream(1, CANCEL)
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_stream_error(STREAM_CLOSED, PROTOCOL_ERROR)


@case("5.1", "closed: Sends a DATA frame")
async def closed_data(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.expect_stream_close()
    await p.data(1, b"test")
    await p.expect_stream_error(STREAM_CLOSED)


@case("5.1", "closed: Sends a HEADERS frame")
async def closed_headers(p: Peer) -> None:
    await p.handshake()
    block = p.encode(p.request())
    await p.headers(1, block)
    await p.expect_stream_close()
    await p.headers(1, block)  # h2spec resends the same bytes
    await p.expect_connection_error(STREAM_CLOSED)


@case("5.1", "closed: Sends a CONTINUATION frame")
async def closed_continuation(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.expect_stream_close()
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_connection_error(STREAM_CLOSED, PROTOCOL_ERROR)


# --- 5.1.1 Stream Identifiers ------------------------------------------------------------


@case("5.1.1", "Sends even-numbered stream identifier")
async def even_stream(p: Peer) -> None:
    await p.handshake()
    await p.headers(2, p.encode(p.request()))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("5.1.1", "Sends stream identifier that is numerically smaller than previous")
async def smaller_stream(p: Peer) -> None:
    await p.handshake()
    await p.headers(5, p.encode(p.request()))
    await p.headers(3, p.encode(p.request()))
    await p.expect_connection_error(PROTOCOL_ERROR)


# --- 5.1.2 Stream Concurrency ------------------------------------------------------------


@case("5.1.2", "Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded")
async def too_many_streams(p: Peer) -> None:
    await p.handshake()
    limit = p.server_settings.get(MAX_CONCURRENT_STREAMS)
    if limit is None:
        raise Mismatch("a SETTINGS_MAX_CONCURRENT_STREAMS limit (h2spec skips the case)", "no limit advertised")
    await p.settings((INITIAL_WINDOW_SIZE, 0))  # the responses stay open
    block = p.encode(p.request())
    for stream_id in range(1, 2 * limit + 2, 2):
        await p.headers(stream_id, block)
    await p.expect_stream_error(PROTOCOL_ERROR, REFUSED_STREAM)


# --- 5.3.1 Stream Dependencies -----------------------------------------------------------


@case("5.3.1", "Sends HEADERS frame that depends on itself")
async def headers_self_dependency(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), priority=priority_payload(1, 255))
    await p.expect_stream_error(PROTOCOL_ERROR)


@case("5.3.1", "Sends PRIORITY frame that depend on itself")
async def priority_self_dependency(p: Peer) -> None:
    await p.handshake()
    await p.priority(1, 1, 255)
    await p.expect_stream_error(PROTOCOL_ERROR)


# --- 5.4.1 Connection Error Handling -----------------------------------------------------

INVALID_PING = b"\x00\x00\x08\x06\x00\x00\x00\x00\x03" + bytes(8)  # PING on stream 3


@case("5.4.1", "Sends an invalid PING frame for connection close")
async def error_closes(p: Peer) -> None:
    await p.handshake()
    await p.send(INVALID_PING)
    await p.expect_connection_close()


@case("5.4.1", "Sends an invalid PING frame to receive GOAWAY frame", strict=True)
async def error_sends_goaway(p: Peer) -> None:
    await p.handshake()
    await p.send(INVALID_PING)
    await p.expect_frame(GOAWAY, "a GOAWAY frame", lambda f: True)


# --- 5.5 Extending HTTP/2 ----------------------------------------------------------------


@case("5.5", "Sends an unknown extension frame")
async def unknown_extension(p: Peer) -> None:
    await p.handshake()
    await p.send(UNKNOWN_FRAME)
    await p.ping()
    await p.expect_ping_ack()


@case("5.5", "Sends an unknown extension frame in the middle of a header block")
async def unknown_inside_block(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_headers=False)
    await p.send(UNKNOWN_FRAME)
    await p.expect_connection_error(PROTOCOL_ERROR)
