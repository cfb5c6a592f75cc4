"""h2spec's ``generic`` cases (what any HTTP/2 server must accept: ``generic/*.go``) and its
``hpack`` cases (RFC 7541 decoding errors: ``hpack/*.go``) in summerwind/h2spec."""

from __future__ import annotations

from tests.protocol.conformance.case import Catalogue
from tests.protocol.conformance.http2_streams import preface
from tests.protocol.conformance.wire import (
    CANCEL,
    COMPRESSION_ERROR,
    DATA,
    ENABLE_PUSH,
    HEADER_TABLE_SIZE,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    Frame,
    Peer,
    priority_payload,
)

GENERIC = Catalogue("generic")
HPACK = Catalogue("hpack")
H2SPEC = b"h2spec\x00\x00"


def any_frame(_: Frame) -> bool:
    return True


# --- generic/1 Starting HTTP/2 -----------------------------------------------------------


# h2spec's generic/1/1 is its http2/3.5/1 again: the same run.
GENERIC.case("1", "Sends a client connection preface")(preface)


# --- generic/2 Streams and Multiplexing --------------------------------------------------


@GENERIC.case("2", "Sends a PRIORITY frame on idle stream")
async def priority_idle(p: Peer) -> None:
    await p.handshake()
    await p.priority(1, 0, 255)
    await p.ping()
    await p.expect_ping_ack()


@GENERIC.case("2", "Sends a WINDOW_UPDATE frame on half-closed (remote) stream")
async def window_update_half_closed(p: Peer) -> None:
    await p.handshake()
    await p.settings((INITIAL_WINDOW_SIZE, 0))
    await p.headers(1, p.encode(p.request()))
    await p.window_update(1, 1)
    await p.expect_frame(DATA, "a DATA frame", any_frame)


@GENERIC.case("2", "Sends a PRIORITY frame on half-closed (remote) stream")
async def priority_half_closed(p: Peer) -> None:
    await p.handshake()
    await p.settings((INITIAL_WINDOW_SIZE, 0))
    await p.headers(1, p.encode(p.request()))
    await p.priority(1, 0, 255)
    await p.window_update(1, 1)
    await p.expect_frame(DATA, "a DATA frame", any_frame)


@GENERIC.case("2", "Sends a RST_STREAM frame on half-closed (remote) stream")
async def rst_half_closed(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.rst_stream(1, CANCEL)
    await p.ping()
    await p.expect_ping_ack_or_close()


@GENERIC.case("2", "Sends a PRIORITY frame on closed stream")
async def priority_closed(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.expect_stream_close()
    await p.priority(1, 0, 255)
    await p.ping()
    await p.expect_ping_ack()


# --- generic/3 Frame Definitions ---------------------------------------------------------


@GENERIC.case("3.1", "Sends a DATA frame")
async def data(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"test")
    await p.expect_headers(1)


@GENERIC.case("3.1", "Sends multiple DATA frames")
async def datas(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"test", end_stream=False)
    await p.data(1, b"test")
    await p.expect_headers(1)


@GENERIC.case("3.1", "Sends a DATA frame with padding")
async def padded_data(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"test", pad=bytes(5))
    await p.expect_headers(1)


@GENERIC.case("3.2", "Sends a HEADERS frame")
async def headers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.expect_headers(1)


@GENERIC.case("3.2", "Sends a HEADERS frame with padding")
async def padded_headers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), pad=8)
    await p.expect_headers(1)


@GENERIC.case("3.2", "Sends a HEADERS frame with priority")
async def headers_with_priority(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), priority=priority_payload(0, 255))
    await p.expect_headers(1)


async def priority_then_request(p: Peer, stream_id: int, depends_on: int, weight: int, exclusive: bool) -> None:
    await p.handshake()
    await p.priority(stream_id, depends_on, weight, exclusive=exclusive)
    await p.headers(1, p.encode(p.request()))
    await p.expect_headers(1)


@GENERIC.case("3.3", "Sends a PRIORITY frame with priority 1")
async def priority_weight_1(p: Peer) -> None:
    await priority_then_request(p, 1, 0, 0, False)


@GENERIC.case("3.3", "Sends a PRIORITY frame with priority 256")
async def priority_weight_256(p: Peer) -> None:
    await priority_then_request(p, 1, 0, 255, False)


@GENERIC.case("3.3", "Sends a PRIORITY frame with stream dependency")
async def priority_dependency(p: Peer) -> None:
    await priority_then_request(p, 3, 1, 0, False)


@GENERIC.case("3.3", "Sends a PRIORITY frame with exclusive")
async def priority_exclusive(p: Peer) -> None:
    await priority_then_request(p, 1, 0, 0, True)


@GENERIC.case("3.3", "Sends a PRIORITY frame for an idle stream, then send a HEADER frame for a lower stream ID")
async def priority_idle_then_lower(p: Peer) -> None:
    await priority_then_request(p, 3, 0, 255, False)


@GENERIC.case("3.4", "Sends a RST_STREAM frame")
async def rst_stream(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()), end_stream=False)
    await p.rst_stream(1, CANCEL)
    await p.ping()
    await p.expect_ping_ack_or_close()


@GENERIC.case("3.5", "Sends a SETTINGS frame")
async def settings(p: Peer) -> None:
    await p.handshake()
    await p.settings(
        (HEADER_TABLE_SIZE, 4096),
        (ENABLE_PUSH, 1),
        (MAX_CONCURRENT_STREAMS, 100),
        (INITIAL_WINDOW_SIZE, 65535),
        (MAX_FRAME_SIZE, 16384),
        (MAX_HEADER_LIST_SIZE, 100),
    )
    await p.expect_settings_ack()


@GENERIC.case("3.7", "Sends a PING frame")
async def ping(p: Peer) -> None:
    await p.handshake()
    await p.ping(H2SPEC)
    await p.expect_ping_ack(H2SPEC)


@GENERIC.case("3.8", "Sends a GOAWAY frame")
async def goaway(p: Peer) -> None:
    await p.handshake()
    await p.goaway(0, NO_ERROR, b"h2spec")
    await p.ping(H2SPEC)
    await p.expect_ping_ack_or_close(H2SPEC)


@GENERIC.case("3.9", "Sends a WINDOW_UPDATE frame with stream ID 0")
async def window_update_connection(p: Peer) -> None:
    await p.handshake()
    await p.window_update(0, 1)
    await p.ping()
    await p.expect_ping_ack()


@GENERIC.case("3.9", "Sends a WINDOW_UPDATE frame with stream ID 1")
async def window_update_stream(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.window_update(1, 1)
    await p.expect_headers(1)


@GENERIC.case("3.10", "Sends a CONTINUATION frame")
async def continuation(p: Peer) -> None:
    await p.handshake()
    block = p.encode(p.request())
    await p.headers(1, block[:5], end_headers=False)
    await p.continuation(1, block[5:])
    await p.expect_headers(1)


@GENERIC.case("3.10", "Sends multiple CONTINUATION frames")
async def continuations(p: Peer) -> None:
    await p.handshake()
    block = p.encode(p.request())
    await p.headers(1, block[:5], end_headers=False)
    await p.continuation(1, block[5:10], end_headers=False)
    await p.continuation(1, block[10:])
    await p.expect_headers(1)


# --- generic/4 HTTP Message Exchanges ----------------------------------------------------


@GENERIC.case("4", "Sends a GET request")
async def get(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request()))
    await p.expect_headers(1)


@GENERIC.case("4", "Sends a HEAD request")
async def head(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("HEAD")))
    await p.expect_headers(1)


@GENERIC.case("4", "Sends a POST request")
async def post(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode(p.request("POST")), end_stream=False)
    await p.data(1, b"test")
    await p.expect_headers(1)


@GENERIC.case("4", "Sends a POST request with trailers")
async def post_with_trailers(p: Peer) -> None:
    await p.handshake()
    await p.headers(1, p.encode([*p.request("POST"), ("trailer", "x-test")]), end_stream=False)
    await p.data(1, b"test", end_stream=False)
    await p.headers(1, p.encode([("x-test", "ok")]))
    await p.expect_headers(1)


# --- generic/5 HPACK: a request with one more field, in each representation -------------


async def request_with(p: Peer, representation: bytes, *, before: bool = False) -> None:
    """A GET whose header block carries ``representation`` after (or before) the request's fields."""
    await p.handshake()
    block = p.encode(p.request())
    await p.headers(1, representation + block if before else block + representation)
    await p.expect_headers(1)


USER_AGENT_HUFFMAN = b"\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4"  # new name "user-agent", Huffman
USER_AGENT_PLAIN = b"\x0auser-agent\x06h2spec"
X_TEST_PLAIN = b"\x06x-test\x06h2spec"
X_TEST_HUFFMAN = b"\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4"
REPRESENTATIONS = (
    ("Sends a indexed header field representation", b"\xba"),
    ("Sends a literal header field with incremental indexing - indexed name", b"\x40" + USER_AGENT_HUFFMAN),
    (
        "Sends a literal header field with incremental indexing - indexed name (with Huffman coding)",
        b"\x40" + USER_AGENT_PLAIN,
    ),
    ("Sends a literal header field with incremental indexing - new name", b"\x40" + X_TEST_PLAIN),
    (
        "Sends a literal header field with incremental indexing - new name (with Huffman coding)",
        b"\x40" + X_TEST_HUFFMAN,
    ),
    ("Sends a literal header field without indexing - indexed name", b"\x00" + USER_AGENT_PLAIN),
    (
        "Sends a literal header field without indexing - indexed name (with Huffman coding)",
        b"\x00" + USER_AGENT_HUFFMAN,
    ),
    ("Sends a literal header field without indexing - new name", b"\x00" + X_TEST_PLAIN),
    ("Sends a literal header field without indexing - new name (huffman encoded)", b"\x00" + X_TEST_HUFFMAN),
    ("Sends a literal header field never indexed - indexed name", b"\x10" + USER_AGENT_PLAIN),
    ("Sends a literal header field never indexed - indexed name (huffman encoded)", b"\x10" + USER_AGENT_HUFFMAN),
    ("Sends a literal header field never indexed - new name", b"\x10" + X_TEST_HUFFMAN),
    ("Sends a literal header field never indexed - new name (huffman encoded)", b"\x10" + X_TEST_HUFFMAN),
)


def _register_representation(description: str, representation: bytes) -> None:
    async def run(p: Peer) -> None:
        await request_with(p, representation)

    GENERIC.case("5", description)(run)


for _description, _representation in REPRESENTATIONS:  # h2spec's exact bytes, names and all
    _register_representation(_description, _representation)


@GENERIC.case("5", "Sends a dynamic table size update")
async def table_size_update(p: Peer) -> None:
    await p.handshake()
    p.set_table_size(128)
    await p.headers(1, p.encode(p.request()))
    await p.expect_headers(1)


@GENERIC.case("5", "Sends multiple dynamic table size update")
async def table_size_updates(p: Peer) -> None:
    await request_with(p, b"\x3f\x61\x3f\xe1\x1f", before=True)  # to 128, then to 4096


# --- hpack: decoding errors, each a connection error COMPRESSION_ERROR -------------------


async def compression_error_for(p: Peer, representation: bytes, *, before: bool = False) -> None:
    await p.handshake()
    block = p.encode(p.request())
    await p.headers(1, representation + block if before else block + representation)
    await p.expect_connection_error(COMPRESSION_ERROR)


def table_size_update_past(limit: int) -> bytes:
    """A dynamic table size update to ``limit + 1`` (a 5-bit prefix integer)."""
    size, out = limit + 1 - 31, bytearray((0x3F,))
    while size >= 128:
        out.append(0x80 | (size & 0x7F))
        size >>= 7
    return bytes((*out, size))


DECODING_ERRORS = (
    ("2.3.3", "Sends a indexed header field representation with invalid index", b"\xc6"),
    ("2.3.3", "Sends a literal header field representation with invalid index", b"\x7f\x07\x00"),
    ("4.2", "Sends a dynamic table size update at the end of header block", b"\x21"),
    (
        "5.2",
        "Sends a Huffman-encoded string literal representation with padding longer than 7 bits",
        b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x49\x50\x9f\xff",
    ),
    (
        "5.2",
        "Sends a Huffman-encoded string literal representation padded by zero",
        b"\x00\x85\xf2\xb2\x4a\x84\xff\x83\x49\x50\x90",
    ),
    (
        "5.2",
        "Sends a Huffman-encoded string literal representation containing the EOS symbol",
        b"\x00\x85\xf2\xb2\x4a\x84\xff\x87\x49\x51\xff\xff\xff\xfa\x7f",
    ),
    ("6.1", "Sends a indexed header field representation with index 0", b"\x80"),
)


def _register_decoding_error(section: str, description: str, representation: bytes) -> None:
    async def run(p: Peer) -> None:
        await compression_error_for(p, representation)

    HPACK.case(section, description)(run)


for _section, _description, _representation in DECODING_ERRORS:
    _register_decoding_error(_section, _description, _representation)


@HPACK.case("6.3", "Sends a dynamic table size update larger than the value of SETTINGS_HEADER_TABLE_SIZE")
async def table_size_update_too_large(p: Peer) -> None:
    await p.handshake()
    block = p.encode(p.request())
    limit = p.server_settings.get(HEADER_TABLE_SIZE, 4096)
    await p.headers(1, table_size_update_past(limit) + block)
    await p.expect_connection_error(COMPRESSION_ERROR)
