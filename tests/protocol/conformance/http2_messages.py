"""h2spec's ``http2`` cases for RFC 7540 section 8: requests, header fields, pseudo-headers,
malformed requests and server push (``http2/8_*.go`` in summerwind/h2spec)."""

from __future__ import annotations

from tests.protocol.conformance.http2_streams import HTTP2
from tests.protocol.conformance.wire import END_HEADERS, PROTOCOL_ERROR, PUSH_PROMISE, Field, Peer

case = HTTP2.case


async def stream_error_for(p: Peer, fields: list[Field]) -> None:
    """One complete request with ``fields`` as its header block: a stream error PROTOCOL_ERROR."""
    await p.handshake()
    await p.headers(1, p.encode(fields))
    await p.expect_stream_error(PROTOCOL_ERROR)


def without(fields: list[Field], name: str) -> list[Field]:
    return [field for field in fields if field[0] != name]


def twice(fields: list[Field], name: str) -> list[Field]:
    return [*fields, *(field for field in fields if field[0] == name)]


# --- 8.1 HTTP Request/Response Exchange --------------------------------------------------


@case("8.1", "Sends a second HEADERS frame without the END_STREAM flag")
async def trailers_without_end_stream(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"test", end_stream=False)
    await p.headers(1, p.encode([("x-test", "ok")]), end_stream=False)
    await p.expect_stream_error(PROTOCOL_ERROR)


# --- 8.1.2 HTTP Header Fields ------------------------------------------------------------


@case("8.1.2", "Sends a HEADERS frame that contains the header field name in uppercase letters")
async def uppercase_name(p: Peer) -> None:
    await stream_error_for(p, [*p.request(), ("X-TEST", "ok")])


# --- 8.1.2.1 Pseudo-Header Fields --------------------------------------------------------


@case("8.1.2.1", "Sends a HEADERS frame that contains a unknown pseudo-header field")
async def unknown_pseudo_header(p: Peer) -> None:
    await stream_error_for(p, [*p.request(), (":test", "ok")])


@case("8.1.2.1", "Sends a HEADERS frame that contains the pseudo-header field defined for response")
async def response_pseudo_header(p: Peer) -> None:
    await stream_error_for(p, [*p.request(), (":status", "200")])


@case("8.1.2.1", "Sends a HEADERS frame that contains a pseudo-header field as trailers")
async def pseudo_header_in_trailers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"test", end_stream=False)
    await p.headers(1, p.encode([(":method", "POST")]), end_stream=False)
    await p.expect_stream_error(PROTOCOL_ERROR)


@case(
    "8.1.2.1",
    "Sends a HEADERS frame that contains a pseudo-header field that appears in a header block after a regular"
    " header field",
)
async def pseudo_header_after_regular(p: Peer) -> None:
    await stream_error_for(p, [("x-test", "ok"), *p.request()])


# --- 8.1.2.2 Connection-Specific Header Fields -------------------------------------------


@case("8.1.2.2", "Sends a HEADERS frame that contains the connection-specific header field")
async def connection_header(p: Peer) -> None:
    await stream_error_for(p, [*p.request(), ("connection", "keep-alive")])


@case("8.1.2.2", 'Sends a HEADERS frame that contains the TE header field with any value other than "trailers"')
async def te_not_trailers(p: Peer) -> None:
    await stream_error_for(p, [*p.request(), ("trailers", "test"), ("te", "trailers, deflate")])


# --- 8.1.2.3 Request Pseudo-Header Fields ------------------------------------------------


@case("8.1.2.3", 'Sends a HEADERS frame with empty ":path" pseudo-header field')
async def empty_path(p: Peer) -> None:
    await stream_error_for(p, [(name, "" if name == ":path" else value) for name, value in p.request()])


@case("8.1.2.3", 'Sends a HEADERS frame that omits ":method" pseudo-header field')
async def no_method(p: Peer) -> None:
    # h2spec's slip, kept: it drops ":method" and then ":scheme" too (headers[1:] of the rest)
    await stream_error_for(p, without(without(p.request(), ":method"), ":scheme"))


@case("8.1.2.3", 'Sends a HEADERS frame that omits ":scheme" pseudo-header field')
async def no_scheme(p: Peer) -> None:
    await stream_error_for(p, without(p.request(), ":scheme"))


@case("8.1.2.3", 'Sends a HEADERS frame that omits ":path" pseudo-header field')
async def no_path(p: Peer) -> None:
    await stream_error_for(p, without(p.request(), ":path"))


@case("8.1.2.3", 'Sends a HEADERS frame with duplicated ":method" pseudo-header field')
async def two_methods(p: Peer) -> None:
    await stream_error_for(p, twice(p.request(), ":method"))


@case("8.1.2.3", 'Sends a HEADERS frame with duplicated ":scheme" pseudo-header field')
async def two_schemes(p: Peer) -> None:
    await stream_error_for(p, twice(p.request(), ":scheme"))


@case("8.1.2.3", 'Sends a HEADERS frame with duplicated ":path" pseudo-header field')
async def two_paths(p: Peer) -> None:
    await stream_error_for(p, twice(p.request(), ":path"))


# --- 8.1.2.6 Malformed Requests and Responses --------------------------------------------


@case(
    "8.1.2.6",
    'Sends a HEADERS frame with the "content-length" header field which does not equal the DATA frame payload length',
)
async def content_length_short(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode([*p.request("POST"), ("content-length", "1")]), end_stream=False)
    await p.data(1, b"test")
    await p.expect_stream_error(PROTOCOL_ERROR)


@case(
    "8.1.2.6",
    'Sends a HEADERS frame with the "content-length" header field which does not equal the sum of the multiple DATA'
    " frames payload length",
)
async def content_length_short_of_frames(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode([*p.request("POST"), ("content-length", "1")]), end_stream=False)
    await p.data(1, b"test", end_stream=False)
    await p.data(1, b"test")
    await p.expect_stream_error(PROTOCOL_ERROR)


# --- 8.2 Server Push ---------------------------------------------------------------------


@case("8.2", "Sends a PUSH_PROMISE frame")
async def push_promise(p: Peer) -> None:
    await p.handshake()
    await p.write(PUSH_PROMISE, END_HEADERS, 1, (3).to_bytes(4, "big") + p.encode(p.request()))
    await p.expect_connection_error(PROTOCOL_ERROR)
