"""h2spec's ``http2`` cases for RFC 7540 sections 6 and 7: each frame type, flow control and
error codes (``http2/6_*.go`` and ``http2/7_error_codes.go`` in summerwind/h2spec)."""

from __future__ import annotations

from tests.protocol.conformance.http2_streams import HTTP2, dummy_headers
from tests.protocol.conformance.wire import (
    CANCEL,
    DATA,
    ENABLE_PUSH,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    PROTOCOL_ERROR,
    RST_STREAM,
    STREAM_CLOSED,
    Peer,
)

case = HTTP2.case
H2SPEC = b"h2spec\x00\x00"  # the PING payload h2spec uses


# --- 6.1 DATA ----------------------------------------------------------------------------


@case("6.1", "Sends a DATA frame with 0x0 stream identifier")
async def data_stream_zero(p: Peer) -> None:
    await p.handshake()
    await p.data(0, b"test")
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.1", 'Sends a DATA frame on the stream that is not in "open" or "half-closed (local)" state')
async def data_not_open(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")))
    await p.data(1, b"test")
    await p.expect_stream_error(STREAM_CLOSED)


@case("6.1", "Sends a DATA frame with invalid pad length")
async def data_bad_padding(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode([*p.request("POST"), ("content-length", "4")]), end_stream=False)
    await p.send(b"\x00\x00\x05\x00\x09\x00\x00\x00\x01" + b"\x06Test")  # 5 octets, pad length 6
    await p.expect_connection_error(PROTOCOL_ERROR)


# --- 6.2 HEADERS -------------------------------------------------------------------------


@case("6.2", "Sends a HEADERS frame without the END_HEADERS flag, and a PRIORITY frame")
async def headers_then_priority(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False, end_headers=False)
    await p.priority(1, 0, 255)
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.2", "Sends a HEADERS frame to another stream while sending a HEADERS frame")
async def headers_then_other_headers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False, end_headers=False)
    await p.headers(3, p.encode(p.request()))
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.2", "Sends a HEADERS frame with 0x0 stream identifier")
async def headers_stream_zero(p: Peer) -> None:
    await p.handshake()
    await p.headers(0, p.encode(p.request()))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.2", "Sends a HEADERS frame with invalid pad length")
async def headers_bad_padding(p: Peer) -> None:
    await p.handshake()
    block = p.encode(p.request())
    # PADDED | END_HEADERS | END_STREAM; the pad length exceeds what follows it
    await p.send(bytes((0, 0, len(block) + 1, 0x01, 0x0D, 0, 0, 0, 1, len(block) + 2)) + block)
    await p.expect_stream_error(PROTOCOL_ERROR)


# --- 6.3 PRIORITY ------------------------------------------------------------------------


@case("6.3", "Sends a PRIORITY frame with 0x0 stream identifier")
async def priority_stream_zero(p: Peer) -> None:
    await p.handshake()
    await p.priority(0, 0, 255)
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.3", "Sends a PRIORITY frame with a length other than 5 octets")
async def priority_bad_length(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.send(b"\x00\x00\x04\x02\x00\x00\x00\x00\x01" + b"\x80\x00\x00\x01")
    await p.expect_stream_error(FRAME_SIZE_ERROR)


# --- 6.4 RST_STREAM ----------------------------------------------------------------------


@case("6.4", "Sends a RST_STREAM frame with 0x0 stream identifier")
async def rst_stream_zero(p: Peer) -> None:
    await p.handshake()
    await p.rst_stream(0, CANCEL)
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.4", "Sends a RST_STREAM frame on a idle stream")
async def rst_idle(p: Peer) -> None:
    await p.handshake()
    await p.rst_stream(1, CANCEL)
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.4", "Sends a RST_STREAM frame with a length other than 4 octets")
async def rst_bad_length(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.send(b"\x00\x00\x03\x03\x00\x00\x00\x00\x01" + bytes(3))
    await p.expect_stream_error(FRAME_SIZE_ERROR)


# --- 6.5 SETTINGS ------------------------------------------------------------------------


@case("6.5", "Sends a SETTINGS frame with ACK flag and payload")
async def settings_ack_payload(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x01\x04\x01\x00\x00\x00\x00" + b"\x00")
    await p.expect_connection_error(FRAME_SIZE_ERROR)


@case("6.5", "Sends a SETTINGS frame with a stream identifier other than 0x0")
async def settings_on_stream(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x06\x04\x00\x00\x00\x00\x01" + b"\x00\x03\x00\x00\x00\x64")
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.5", "Sends a SETTINGS frame with a length other than a multiple of 6 octets")
async def settings_bad_length(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x03\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00")
    await p.expect_stream_error(PROTOCOL_ERROR, FRAME_SIZE_ERROR)


# --- 6.5.2 Defined SETTINGS Parameters ---------------------------------------------------


@case("6.5.2", "SETTINGS_ENABLE_PUSH (0x2): Sends the value other than 0 or 1")
async def enable_push_two(p: Peer) -> None:
    await p.handshake()
    await p.settings((ENABLE_PUSH, 2))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.5.2", "SETTINGS_INITIAL_WINDOW_SIZE (0x4): Sends the value above the maximum flow control window size")
async def window_too_large(p: Peer) -> None:
    await p.handshake()
    await p.settings((INITIAL_WINDOW_SIZE, 2**31))
    await p.expect_connection_error(FLOW_CONTROL_ERROR)


@case("6.5.2", "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value below the initial value")
async def max_frame_too_small(p: Peer) -> None:
    await p.handshake()
    await p.settings((MAX_FRAME_SIZE, 16383))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.5.2", "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value above the maximum allowed frame size")
async def max_frame_too_large(p: Peer) -> None:
    await p.handshake()
    await p.settings((MAX_FRAME_SIZE, 2**24))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.5.2", "Sends a SETTINGS frame with unknown identifier")
async def unknown_setting(p: Peer) -> None:
    await p.handshake()
    await p.settings((0xFF, 1))
    await p.ping()
    await p.expect_ping_ack()


# --- 6.5.3 Settings Synchronization ------------------------------------------------------


@case("6.5.3", "Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE")
async def settings_in_order(p: Peer) -> None:
    await p.handshake()
    await p.settings((INITIAL_WINDOW_SIZE, 100), (INITIAL_WINDOW_SIZE, 1))
    await p.expect_settings_ack()
    await p.headers(1, p.encode(p.request()))
    await p.expect_data_length(1)


@case("6.5.3", "Sends a SETTINGS frame without ACK flag")
async def settings_acknowledged(p: Peer) -> None:
    await p.handshake()
    await p.settings((ENABLE_PUSH, 0))
    await p.expect_settings_ack()


# --- 6.7 PING ----------------------------------------------------------------------------


@case("6.7", "Sends a PING frame")
async def ping(p: Peer) -> None:
    await p.handshake()
    await p.ping(H2SPEC)
    await p.expect_ping_ack(H2SPEC)


@case("6.7", "Sends a PING frame with ACK")
async def ping_ack_ignored(p: Peer) -> None:
    await p.handshake()
    await p.ping(b"invalid\x00", ack=True)
    await p.ping(H2SPEC)
    await p.expect_ping_ack(H2SPEC)


@case("6.7", "Sends a PING frame with a stream identifier field value other than 0x0")
async def ping_on_stream(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x08\x06\x00\x00\x00\x00\x01" + bytes(8))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.7", "Sends a PING frame with a length field value other than 8")
async def ping_bad_length(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x06\x06\x00\x00\x00\x00\x00" + bytes(6))
    await p.expect_connection_error(FRAME_SIZE_ERROR)


# --- 6.8 GOAWAY --------------------------------------------------------------------------


@case("6.8", "Sends a GOAWAY frame with a stream identifier other than 0x0")
async def goaway_on_stream(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x08\x07\x00\x00\x00\x00\x01" + bytes(8))
    await p.expect_connection_error(PROTOCOL_ERROR)


# --- 6.9 WINDOW_UPDATE -------------------------------------------------------------------


@case("6.9", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0")
async def window_update_zero(p: Peer) -> None:
    await p.handshake()
    await p.window_update(0, 0)
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.9", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0 on a stream")
async def window_update_zero_on_stream(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False)
    await p.window_update(1, 0)
    await p.expect_stream_error(PROTOCOL_ERROR)


@case("6.9", "Sends a WINDOW_UPDATE frame with a length other than 4 octets")
async def window_update_bad_length(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x03\x08\x00\x00\x00\x00\x00" + b"\x00\x00\x01")
    await p.expect_connection_error(FRAME_SIZE_ERROR)


# --- 6.9.1 The Flow-Control Window -------------------------------------------------------


@case("6.9.1", "Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame")
async def window_of_one(p: Peer) -> None:
    await p.handshake()
    await p.settings((INITIAL_WINDOW_SIZE, 1))
    await p.expect_settings_ack()
    await p.headers(1, p.encode(p.request()))
    await p.expect_data_length(1)


@case("6.9.1", "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1")
async def connection_window_overflow(p: Peer) -> None:
    await p.handshake()
    await p.window_update(0, 2**31 - 1)
    await p.window_update(0, 2**31 - 1)
    await p.expect_frame(GOAWAY, "GOAWAY FLOW_CONTROL_ERROR", lambda f: f.code == FLOW_CONTROL_ERROR)


@case("6.9.1", "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream")
async def stream_window_overflow(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False)
    await p.window_update(1, 2**31 - 1)
    await p.window_update(1, 2**31 - 1)
    await p.expect_frame(
        RST_STREAM,
        "RST_STREAM FLOW_CONTROL_ERROR on stream 1",
        lambda f: f.stream_id == 1 and f.code == FLOW_CONTROL_ERROR,
    )


# --- 6.9.2 Initial Flow-Control Window Size ----------------------------------------------


@case("6.9.2", "Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame")
async def window_grows_after_headers(p: Peer) -> None:
    await p.handshake()
    await p.settings((INITIAL_WINDOW_SIZE, 0))
    await p.expect_settings_ack()
    await p.headers(1, p.encode(p.request()))
    await p.settings((INITIAL_WINDOW_SIZE, 1))
    await p.expect_data_length(1)


@case("6.9.2", "Sends a SETTINGS frame for window size to be negative")
async def negative_window(p: Peer) -> None:
    await p.handshake()
    await p.settings((INITIAL_WINDOW_SIZE, 3))
    await p.expect_settings_ack()
    await p.headers(1, p.encode(p.request()))
    await p.expect_frame(DATA, "a DATA frame", lambda f: True)
    await p.settings((INITIAL_WINDOW_SIZE, 2))  # 3 octets sent: the window becomes -1
    await p.expect_settings_ack()
    await p.window_update(1, 2)
    await p.expect_data_length(1)


@case("6.9.2", "Sends a SETTINGS_INITIAL_WINDOW_SIZE settings with an exceeded maximum window size value")
async def initial_window_overflow(p: Peer) -> None:
    await p.handshake()
    await p.send(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x04\x80\x00\x00\x00")
    await p.expect_connection_error(FLOW_CONTROL_ERROR)


# --- 6.10 CONTINUATION -------------------------------------------------------------------


@case("6.10", "Sends multiple CONTINUATION frames preceded by a HEADERS frame")
async def continuations(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_headers=False)
    await p.continuation(1, p.encode(dummy_headers(1)), end_headers=False)
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_headers(1)


@case("6.10", "Sends a CONTINUATION frame followed by any frame other than CONTINUATION")
async def continuation_then_data(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False, end_headers=False)
    await p.continuation(1, p.encode(dummy_headers(1)), end_headers=False)
    await p.data(1, b"test")
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.10", "Sends a CONTINUATION frame with 0x0 stream identifier")
async def continuation_stream_zero(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_headers=False)
    await p.continuation(0, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.10", "Sends a CONTINUATION frame preceded by a HEADERS frame with END_HEADERS flag")
async def continuation_after_end_headers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.10", "Sends a CONTINUATION frame preceded by a CONTINUATION frame with END_HEADERS flag")
async def continuation_after_ended_continuation(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_headers=False)
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.continuation(1, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


@case("6.10", "Sends a CONTINUATION frame preceded by a DATA frame")
async def continuation_after_data(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False, end_headers=False)
    await p.data(1, b"test")
    await p.continuation(1, p.encode(dummy_headers(1)), end_headers=False)
    await p.continuation(0, p.encode(dummy_headers(1)))
    await p.expect_connection_error(PROTOCOL_ERROR)


# --- 7 Error Codes -----------------------------------------------------------------------


@case("7", "Sends a GOAWAY frame with unknown error code")
async def goaway_unknown_code(p: Peer) -> None:
    await p.handshake()
    await p.goaway(0, 0xFF)
    await p.ping(H2SPEC)
    await p.expect_ping_ack_or_close(H2SPEC)


@case("7", "Sends a RST_STREAM frame with unknown error code")
async def rst_unknown_code(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.rst_stream(1, 0xFF)
    await p.ping()
    await p.expect_ping_ack_or_close()
