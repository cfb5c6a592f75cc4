"""The HTTP/1.1 fast path (:mod:`llmsim.protocol.native.http1_fastpath`) is h11, minus the cost.

Four layers: the request parser accepts only heads h11 parses, into the same request,
with h11 left keep-alive, not waiting for 100-continue and not switching protocols
(hypothesis, over heads built from ordinary and awkward pieces); the response head and
the last chunk are h11's bytes; and through a real connection every conversation in
:data:`CONVERSATIONS` gets the same bytes back, to the last one, with the fast path as
without it; and a write framed into the next batch at once still leaves one chunk per
step, and buffers (water marks and all) while the connection is congested.
"""

from __future__ import annotations

import attrs
import h11
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from llmsim.api.http import HttpRequest, ResponseStream, reason_phrase
from llmsim.protocol.native import http1
from llmsim.protocol.native.frames import last_chunk
from llmsim.protocol.native.http1_fastpath import chunked_head, parse_whole_request
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings
from tests.protocol.helpers import SSE, TestApp, open_memory_connection, settings

MAX_HEAD = 400
MAX_BODY = 50

# --- requests: parse_whole_request against h11 --------------------------------------------

methods = st.sampled_from([b"GET", b"POST", b"HEAD", b"CONNECT", b"get", b"M-SEARCH", b"P~!", b"BAD METHOD", b""])
targets = st.sampled_from(
    [b"/", b"/v1/chat/completions?a=1&b", b"http://h/x?y", b"*", b"/a b", b"/\x7f", b"/\xff", b""]
)
versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 "])
names = st.sampled_from(
    [b"Host", b"host", b"HOST", b"Content-Length", b"content-length", b"Connection", b"Transfer-Encoding",
     b"Expect", b"Upgrade", b"X-Thing", b"user-agent", b"bad name", b"", b"x:y", b"\xe9"]
)  # fmt: skip
values = st.sampled_from(
    [b"x", b"3", b"0", b" 3 ", b"3, 3", b"03", b"-1", b"9" * 21, b"close", b"keep-alive", b"Keep-Alive, Close",
     b"upgrade", b"chunked", b"100-continue", b"h2c", b"a b\tc", b"", b" ", b"\tx\t", b"a\x00b", b"\x01", b"\xe9t\xe9"]
)  # fmt: skip
line_ends = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r", b"\r\n "])


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    line_end = draw(line_ends)
    head = draw(methods) + b" " + draw(targets) + b" " + draw(versions) + b"\r\n"
    for name, value in draw(st.lists(st.tuples(names, values), max_size=6)):
        separator = draw(st.sampled_from([b": ", b":", b" : ", b":\t"]))
        head += name + separator + value + draw(st.sampled_from([b"\r\n", b"\r\n", line_end]))
    if draw(st.booleans()):
        head += b"Host: h\r\n"
    head += draw(st.sampled_from([b"\r\n", b"\r\n", b"\n", b""]))
    return head + draw(st.sampled_from([b"", b"abc", b"abcdef", b"abcGET / HTTP/1.1\r\n"]))


def h11_view(data: bytes) -> tuple[h11.Request, bytes, bytes, h11.Connection] | None:
    """What h11 makes of ``data``: the request, its body, what follows it, the
    connection (answered with an empty chunked 200); None if it is not whole or not valid."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    body = b""
    try:
        request = conn.next_event()
        if not isinstance(request, h11.Request):
            return None
        while not isinstance(event := conn.next_event(), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                return None
            body += event.data
    except h11.RemoteProtocolError:
        return None
    conn.send(h11.Response(status_code=200, headers=[]))
    conn.send(h11.EndOfMessage())
    return request, body, conn.trailing_data[0], conn


@given(raw_requests())
def test_a_request_parsed_without_h11_is_what_h11_parses(data: bytes) -> None:
    parsed = parse_whole_request(data, "http", MAX_HEAD, MAX_BODY)
    if parsed is None:
        return
    request, end = parsed
    seen = h11_view(data)
    assert seen is not None, "h11 does not parse what the fast path parsed"
    head, body, rest, conn = seen
    method, target = head.method, head.target
    assert (request.method, request.body, data[end:]) == (method.decode(), body, rest)
    assert request.headers == tuple(head.headers) and request.http_version == "1.1"
    assert (request.path, request.query) == http1.split_target(target)
    # Nothing else h11 would have acted on: keep-alive, no 100-continue, no switch.
    assert conn.our_state is h11.DONE and conn.their_state is h11.DONE
    assert not conn.client_is_waiting_for_100_continue and method not in (b"HEAD", b"CONNECT")


def test_the_fast_path_takes_the_ordinary_request_and_declines_the_rest() -> None:
    ordinary = b"POST /v1/x HTTP/1.1\r\nHost: h\r\ncontent-type: a/b\r\nContent-Length: 3\r\n\r\nabc"
    parsed = parse_whole_request(ordinary + b"GET", "https", MAX_HEAD, MAX_BODY)
    assert parsed == (
        HttpRequest(
            method="POST",
            path="/v1/x",
            headers=((b"host", b"h"), (b"content-type", b"a/b"), (b"content-length", b"3")),
            body=b"abc",
            scheme="https",
        ),
        len(ordinary),
    )
    declined = [
        ordinary[:-1],  # body not all there
        ordinary.replace(b"1.1", b"1.0"),
        ordinary.replace(b"Host: h\r\n", b""),
        ordinary.replace(b"Host: h", b"Host: h\r\nHost: h"),
        ordinary.replace(b"Host: h", b"Host: h\r\nConnection: keep-alive, close"),
        ordinary.replace(b"Host: h", b"Host: h\r\nExpect: 100-continue"),
        ordinary.replace(b"Host: h", b"Host: h\r\nUpgrade: h2c"),
        ordinary.replace(b"Content-Length: 3", b"Transfer-Encoding: chunked"),
        ordinary.replace(b"POST", b"HEAD"),
        ordinary.replace(b"content-type: a/b", b"x: " + b"y" * MAX_HEAD),  # 431 is h11's path's
        ordinary.replace(b"Content-Length: 3", b"Content-Length: %d" % (MAX_BODY + 1)),  # 413 too
    ]
    assert [parse_whole_request(data, "http", MAX_HEAD, MAX_BODY) for data in declined] == [None] * len(declined)
    keep_alive = ordinary.replace(b"Host: h", b"Host: h\r\nConnection: Keep-Alive")
    assert parse_whole_request(keep_alive, "http", MAX_HEAD, MAX_BODY) is not None


# --- responses: chunked_head and last_chunk against h11 ----------------------------------

statuses = st.sampled_from([200, 201, 204, 299, 304, 404, 429, 500, 503, 999, 1000, 101, 199])
response_names = st.sampled_from(
    [b"content-type", b"Content-Type", b"x-request-id", b"content-length", b"Connection", b"transfer-encoding",
     b"host", b"bad name", b"", b"x\x00"]
)  # fmt: skip
response_values = st.sampled_from([b"text/event-stream", b"a b", b"", b"12", b"close", b"chunked", b" x", b"x\n"])


def h11_head(status: int, headers: list[tuple[bytes, bytes]]) -> tuple[bytes, bool] | None:
    """h11's head for a GET keep-alive HTTP/1.1 request, and whether it is chunked
    with the connection kept open; None if h11 refuses it."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    conn.next_event(), conn.next_event()
    try:
        head = conn.send(h11.Response(status_code=status, headers=headers, reason=reason_phrase(status)))
    except h11.LocalProtocolError:
        return None
    assert head is not None
    chunked = conn.send(h11.Data(data=b"x")) == b"1\r\nx\r\n"
    conn.send(h11.EndOfMessage())
    return head, chunked and conn.our_state is h11.DONE


@given(statuses, st.lists(st.tuples(response_names, response_values), max_size=4))
def test_a_head_written_without_h11_is_h11s_chunked_head(status: int, headers: list[tuple[bytes, bytes]]) -> None:
    head = chunked_head(status, tuple(headers))
    if head is None:
        return
    assert h11_head(status, headers) == (head, True)
    assert chunked_head(status, tuple(headers)) is head  # remembered


def test_the_sse_head_is_written_without_h11_and_a_content_length_head_is_not() -> None:
    assert (
        chunked_head(200, SSE)
        == b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert chunked_head(200, ((b"content-length", b"2"),)) is None
    assert chunked_head(204, ()) is None


@pytest.mark.parametrize(
    "trailers",
    [(), ((b"x-checksum", b"abc"),), ((b"X-A", b"1"), (b"host", b"h"), (b"content-length", b"5 ,5"))],
)
def test_the_last_chunk_is_what_h11_writes_for_end_of_message(trailers: tuple[tuple[bytes, bytes], ...]) -> None:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    conn.next_event(), conn.next_event()
    conn.send(h11.Response(status_code=200, headers=[]))
    assert last_chunk(trailers) == conn.send(h11.EndOfMessage(headers=list(trailers)))


def test_a_trailer_h11_would_refuse_is_refused() -> None:
    with pytest.raises(h11.LocalProtocolError):
        last_chunk(((b"bad name", b"x"),))


# --- through a connection: the same bytes with and without the fast path -------------------


class FastPathApp(TestApp):
    """TestApp, plus responses the fast path writes differently or declines."""

    async def _route(self, request: HttpRequest, response: ResponseStream) -> None:
        path = request.path
        if path == "/trailers":
            response.start(200, SSE)
            response.write(b"data: 1\n\n")
            response.end(trailers=((b"x-checksum", b"abc"),))
        elif path == "/late-start":
            self.holding.set()
            await self.release.wait()
            response.start(200, SSE)
            response.end(b"data: 1\n\n")
        elif path == "/no-content":
            response.start(204, ())
            response.end()
        elif path == "/app-close":
            response.start(200, (*SSE, (b"connection", b"close")))
            response.end(b"data: 1\n\n")
        elif path == "/bad-header":
            response.start(200, (*SSE, (b"x-bad", b"a\nb")))
            response.end(b"data: 1\n\n")
        elif path == "/request-id":
            response.start(200, (*SSE, (b"x-request-id", request.header("x-request-id").encode())))  # type: ignore[union-attr]
            response.end(b"data: 1\n\n")
        else:
            await super()._route(request, response)


def _post(path: bytes, body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (path, extra, len(body), body)


#: (``/burst`` writes without checkpoints: where its chunks end does not depend on trio's scheduling.)
CONVERSATIONS: dict[str, list[bytes]] = {
    "stream": [_post(b"/burst?n=3")],
    "two in a row": [_post(b"/burst?n=2"), _post(b"/burst?n=2")],
    "pipelined": [_post(b"/burst?n=3") + _post(b"/echo", b"hi") + b"GET /burst?n=2 HTTP/1.1\r\nHost: x\r\n\r\n"],
    "pipelined half a head": [_post(b"/burst?n=2") + b"GET /burst HTTP/1.1\r\nHo", b"st: x\r\n\r\n"],
    "body in pieces": [_post(b"/echo", b"hello")[:-3], b"llo", _post(b"/burst?n=1")],
    "content-length response": [_post(b"/echo", b"hi"), _post(b"/health"), _post(b"/nowhere")],
    "content-length response, pipelined": [_post(b"/echo", b"hi") + _post(b"/burst?n=2") + _post(b"/echo", b"ho")],
    "head": [b"HEAD /burst HTTP/1.1\r\nHost: x\r\n\r\n", _post(b"/burst?n=1")],
    "connection close": [_post(b"/burst?n=2", extra=b"Connection: close\r\n")],
    "keep-alive": [_post(b"/burst?n=2", extra=b"Connection: keep-alive\r\n"), _post(b"/burst?n=1")],
    "http/1.0": [_post(b"/burst?n=2").replace(b"HTTP/1.1", b"HTTP/1.0")],
    "expect": [_post(b"/echo", b"hi", b"Expect: 100-continue\r\n")[:-2], b"hi"],
    "h2c": [
        b"GET /burst?n=1 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
    ],
    "fail before the head": [_post(b"/fail"), _post(b"/burst?n=1")],
    "fail after the head": [_post(b"/fail-late")],
    "no end": [_post(b"/noend")],
    "trailers": [_post(b"/trailers"), _post(b"/burst?n=1")],
    "204": [_post(b"/no-content"), _post(b"/burst?n=1")],
    "app says close": [_post(b"/app-close"), _post(b"/burst?n=1")],
    "invalid response header": [_post(b"/bad-header")],
    "request ids": [_post(b"/request-id", extra=b"x-request-id: %d\r\n" % i) for i in range(3)],
    "malformed": [_post(b"/burst").replace(b"Host: x", b"Host x")],
    "no host": [_post(b"/burst").replace(b"Host: x\r\n", b"")],
    "two hosts": [_post(b"/burst").replace(b"Host: x", b"Host: x\r\nHost: y")],
    "too big": [_post(b"/echo", b"x" * 200)],
    # A head pipelined behind a bypassed request, its body sent after the response: h11
    # holds that head, so the body must not be taken for a request of its own.
    "body after a pipelined head": [
        _post(b"/burst?n=1") + b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 36\r\n\r\n",
        b"GET /burst?n=2 HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
}


async def converse(sends: list[bytes], *, fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, int]:
    """Everything the server sends back, and how many requests took the fast path."""
    taken = 0

    def parse(*args: object) -> object:
        nonlocal taken
        parsed = parse_whole_request(*args) if fast else None  # type: ignore[arg-type]
        taken += parsed is not None
        return parsed

    monkeypatch.setattr(http1, "parse_whole_request", parse)
    received = b""
    async with open_memory_connection(FastPathApp(), settings(max_body_bytes=100)) as mc:
        for data in sends:
            await mc.client.send_all(data)
            await trio.testing.wait_all_tasks_blocked()
            while True:
                with trio.move_on_after(0) as scope:
                    piece = await mc.client.receive_some(65536)
                if scope.cancelled_caught or not piece:
                    break
                received += piece
        await mc.client.send_eof()
        while piece := await mc.client.receive_some(65536):
            received += piece
    return received, taken


@pytest.mark.parametrize("name", CONVERSATIONS)
async def test_every_conversation_gets_the_same_bytes_with_and_without_the_fast_path(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow, none_taken = await converse(CONVERSATIONS[name], fast=False, monkeypatch=monkeypatch)
    fast, taken = await converse(CONVERSATIONS[name], fast=True, monkeypatch=monkeypatch)
    assert none_taken == 0
    assert fast == slow
    if name in ("stream", "two in a row", "keep-alive", "request ids", "content-length response", "trailers"):
        assert taken >= len(CONVERSATIONS[name])  # (the fast path was tried and taken)


async def test_a_bypassed_request_sees_what_pipelined_after_it_once_its_response_is_done() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(_post(b"/hold"))
        await app.holding.wait()
        handler = mc.connection.handler
        assert isinstance(handler, http1.Http1Handler) and handler._held == []  # h11 never saw it
        await mc.client.send_all(_post(b"/echo", b"hi")[:20])
        await mc.client.send_all(_post(b"/echo", b"hi")[20:])
        await trio.testing.wait_all_tasks_blocked()
        assert app.log == ["start /hold"]  # one request at a time
        app.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert app.log == ["start /hold", "end /hold", "start /echo", "end /echo"]
        assert app.requests[1].body == b"hi"


async def shut_down_while_the_head_waits(*, fast: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    if not fast:
        monkeypatch.setattr(http1, "parse_whole_request", lambda *args: None)
    app = FastPathApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(_post(b"/late-start"))
        await app.holding.wait()
        mc.connection.begin_shutdown()
        app.release.set()
        received = b""
        while piece := await mc.client.receive_some(65536):
            received += piece
    return received


async def test_shutdown_before_the_head_of_a_bypassed_request_says_close_as_h11_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = await shut_down_while_the_head_waits(fast=True, monkeypatch=monkeypatch)
    slow = await shut_down_while_the_head_waits(fast=False, monkeypatch=monkeypatch)
    assert fast == slow and b"connection: close\r\n" in fast.lower() and fast.endswith(b"0\r\n\r\n")


# --- the per-token path: a write framed into the next batch ------------------------------------


@attrs.define(eq=False)
class Wire:
    """The least a handler needs of its connection; spawned handlers are kept, not run."""

    settings: ProtocolSettings = attrs.field(factory=ProtocolSettings)
    tracker: ConnectionTracker = attrs.field(factory=ConnectionTracker)
    app: object = None
    scheme: str = "http"
    congested: bool = False
    shutting_down: bool = False
    streams: list[http1.Http1Response] = attrs.field(factory=list)
    wakes: int = 0

    def wake_writer(self) -> None:
        self.wakes += 1

    def spawn(self, fn: object, app: object, request: HttpRequest, stream: http1.Http1Response, *rest: object) -> None:
        self.streams.append(stream)

    def set_read_deadline(self, deadline: float) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def streaming(wire: Wire) -> tuple[http1.Http1Handler, http1.Http1Response]:
    handler = http1.Http1Handler(wire)  # type: ignore[arg-type]
    handler.receive(_post(b"/x"))
    (stream,) = wire.streams
    stream.start(200, SSE)
    assert handler.outgoing().startswith(b"HTTP/1.1 200 OK\r\n")
    handler.flushed()
    assert handler._raw == b""  # the request's bytes are not kept once the head is out
    return handler, stream


async def test_a_lone_write_is_framed_at_once_and_one_steps_writes_still_leave_as_one_chunk() -> None:
    wire = Wire()
    handler, stream = streaming(wire)
    assert stream.write(b"a") and stream.buffered == 0  # framed: nothing waits in the buffer
    assert handler.outgoing() == b"1\r\na\r\n"
    handler.flushed()
    stream.write(b"b")
    stream.write(b"cd")  # takes b's chunk back
    assert stream.write(b"") and handler.outgoing() == b"3\r\nbcd\r\n"
    handler.flushed()
    stream.write(b"e")
    stream.end(b"f")  # likewise
    assert handler.outgoing() == b"2\r\nef\r\n0\r\n\r\n"
    handler.flushed()
    assert handler.outgoing() == b"" and wire.tracker.requests_served == 1 and stream.state.closed


async def test_a_congested_connection_buffers_writes_and_feels_the_water_marks() -> None:
    wire = Wire(settings=settings(high_water=10, low_water=5))
    handler, stream = streaming(wire)
    assert not stream.write(b"x" * 10)  # not below the low-water mark: buffered, and full
    assert handler.outgoing() == b"a\r\nxxxxxxxxxx\r\n"
    handler.flushed()
    wire.congested = True
    assert stream.write(b"ab") and stream.write(b"cdefghij") is False and stream.buffered == 10
    wire.congested = False
    assert handler.outgoing() == b"a\r\nabcdefghij\r\n"
