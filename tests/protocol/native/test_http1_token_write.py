"""The HTTP/1.1 per-token and per-request shortcuts (issue 16, third pass) change no byte.

A write framed at once gets its chunk-size line from a table (``SIZE_LINES``) up to
4 KiB and from :func:`.frames.chunk` above: the same bytes either way.  A request head
is parsed once per distinct head (``http1_fastpath._parsed``): a head seen before gives
the request it gave the first time, with this request's body, and the limits of the
connection that receives it still apply.  ``Http1Handler.finished`` is an attribute now:
it must follow every way the handler finishes.
"""

from __future__ import annotations

import pytest

from llmsim.protocol.native import http1_fastpath
from llmsim.protocol.native.frames import chunk
from llmsim.protocol.native.http1_fastpath import SIZE_LINES, parse_whole_request
from tests.protocol.helpers import settings
from tests.protocol.native.test_http1_fastpath import Wire, _post, streaming


@pytest.mark.parametrize("size", [1, 9, 16, 230, 255, 256, len(SIZE_LINES) - 1, len(SIZE_LINES), 5000])
async def test_a_write_framed_at_once_is_frames_chunk_on_both_sides_of_the_table(size: int) -> None:
    wire = Wire(settings=settings(low_water=8192, high_water=16384))
    handler, stream = streaming(wire)
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert stream.write(data) and stream.buffered == 0  # framed at once
    assert handler.outgoing() == chunk(data) == b"%x\r\n%b\r\n" % (size, data)
    handler.flushed()


def test_the_size_lines_are_the_hexadecimal_sizes() -> None:
    assert SIZE_LINES[0xE6] == b"e6\r\n" and SIZE_LINES[1] == b"1\r\n"
    assert all(line == b"%x\r\n" % size for size, line in enumerate(SIZE_LINES))


def test_a_head_seen_before_gives_the_same_request_with_this_ones_body() -> None:
    http1_fastpath._parsed.clear()
    first = parse_whole_request(_post(b"/v1/x?a=1", b'{"a":1}'), "http", 1000, 100, 1.0)
    assert first is not None and len(http1_fastpath._parsed) == 1
    second = parse_whole_request(_post(b"/v1/x?a=1", b'{"a":2}') + b"GET", "https", 1000, 100, 2.0)
    assert second is not None and len(http1_fastpath._parsed) == 1  # the same head: parsed once
    (one, end_one), (two, end_two) = first, second
    assert (two.method, two.path, two.query, two.headers) == (one.method, "/v1/x", "a=1", one.headers)
    assert (two.body, two.scheme, two.received_at, end_two) == (b'{"a":2}', "https", 2.0, end_one)


def test_the_limits_apply_to_a_head_seen_before() -> None:
    http1_fastpath._parsed.clear()
    request = _post(b"/x", b"x" * 40)
    assert parse_whole_request(request, "http", 1000, 100) is not None
    assert parse_whole_request(request, "http", 1000, 39) is None  # the body is over this limit
    assert parse_whole_request(request, "http", 20, 100) is None  # the head is over this limit
    assert parse_whole_request(request[:-1], "http", 1000, 100) is None  # the body is not all there
    assert parse_whole_request(request, "http", 1000, 100) is not None


def test_a_declined_head_stays_declined_and_the_memory_is_bounded() -> None:
    http1_fastpath._parsed.clear()
    head = b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n"
    assert parse_whole_request(head, "http", 1000, 100) is None
    assert parse_whole_request(head, "http", 1000, 100) is None and head in http1_fastpath._parsed
    for index in range(http1_fastpath._MAX_HEADS + 5):
        assert parse_whole_request(_post(b"/%d" % index), "http", 1000, 100) is not None
    assert len(http1_fastpath._parsed) <= http1_fastpath._MAX_HEADS


def test_a_long_head_is_parsed_every_time_and_not_remembered() -> None:
    http1_fastpath._parsed.clear()
    long = _post(b"/x", b"{}", b"X-Long: " + b"a" * 3000 + b"\r\n")
    assert parse_whole_request(long, "http", 8192, 100) is not None and not http1_fastpath._parsed


async def test_finished_follows_a_response_that_closes_the_connection() -> None:
    wire = Wire()
    handler, stream = streaming(wire)
    assert not handler.finished
    handler.begin_shutdown()  # close after this response
    stream.end()
    handler.outgoing()
    assert not handler.finished
    handler.flushed()
    assert handler.finished


async def test_finished_follows_a_lost_connection() -> None:
    handler, _ = streaming(Wire())
    handler.connection_lost()
    assert handler.finished
