"""AsgiApp and AsgiResponseStream, driven through fake ``receive``/``send`` (no network)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.protocol.asgi.app import AsgiApp
from llmsim.protocol.asgi.stream import AsgiResponseStream
from llmsim.protocol.settings import ConnectionTracker

Message = dict[str, Any]
JSON = ((b"content-type", b"application/json"),)


@attrs.define(eq=False)
class FnApp:
    """An Application made of one async function; remembers the requests it got."""

    fn: Callable[[HttpRequest, ResponseStream], Awaitable[None]]
    requests: list[HttpRequest] = attrs.field(factory=list)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        self.requests.append(request)
        await self.fn(request, response)


@attrs.define(eq=False)
class Peer:
    """The server side of one ASGI call: messages in, messages out, both queued."""

    _inbox_send: trio.MemorySendChannel[Message]
    _inbox: trio.MemoryReceiveChannel[Message]
    _outbox: trio.MemorySendChannel[Message]
    sent: trio.MemoryReceiveChannel[Message]

    @classmethod
    def new(cls, *messages: Message) -> Peer:
        peer = cls(*trio.open_memory_channel[Message](math.inf), *trio.open_memory_channel[Message](math.inf))
        for message in messages:
            peer.push(message)
        return peer

    def push(self, message: Message) -> None:
        self._inbox_send.send_nowait(message)

    async def receive(self) -> Message:
        return await self._inbox.receive()

    async def send(self, message: Message) -> None:
        await self._outbox.send(message)

    def unread(self) -> int:
        return self._inbox.statistics().current_buffer_used

    def all_sent(self) -> list[Message]:
        messages = []
        while True:
            try:
                messages.append(self.sent.receive_nowait())
            except trio.WouldBlock:
                return messages


def http_scope(method: str = "GET", path: str = "/", query: bytes = b"", headers: Any = ()) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.1"},
        "http_version": "2",
        "method": method,
        "scheme": "https",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": list(headers),
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


def request_message(body: bytes = b"", more: bool = False) -> Message:
    return {"type": "http.request", "body": body, "more_body": more}


def start(status: int, headers: Any) -> Message:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def body(data: bytes, more: bool) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def answer_json(request: HttpRequest, response: ResponseStream) -> None:
    data = orjson.dumps({"path": request.path, "body": request.body.decode()})
    response.start(200, (*JSON, (b"content-length", str(len(data)).encode())))
    response.end(data)


async def test_get_builds_the_request_and_sends_one_response() -> None:
    app = FnApp(answer_json)
    peer = Peer.new(request_message())
    scope = http_scope("GET", "/v1/models", b"a=1&b=2", [(b"Host", b"sim"), (b"X-Request-Id", b"7")])
    called_at = trio.current_time()
    await AsgiApp(app)(scope, peer.receive, peer.send)

    (request,) = app.requests
    # Arrived when the call began (hypercorn gives no earlier time): a TTFT counts from there.
    assert request.received_at is not None and called_at <= request.received_at <= trio.current_time()
    assert request == HttpRequest(
        method="GET",
        path="/v1/models",
        query="a=1&b=2",
        headers=((b"host", b"sim"), (b"x-request-id", b"7")),
        body=b"",
        http_version="2",
        scheme="https",
        received_at=request.received_at,
    )
    data = b'{"path":"/v1/models","body":""}'
    assert peer.all_sent() == [start(200, [*JSON, (b"content-length", b"31")]), body(data, False)]


async def test_post_body_arriving_in_chunks_is_read_whole() -> None:
    app = FnApp(answer_json)
    peer = Peer.new(request_message(b'{"a"', more=True), request_message(b": 1}", more=True), request_message())
    await AsgiApp(app)(http_scope("POST", "/echo"), peer.receive, peer.send)

    assert app.requests[0].body == b'{"a": 1}'
    assert peer.all_sent()[-1] == body(b'{"path":"/echo","body":"{\\"a\\": 1}"}', False)


async def test_writes_between_two_sends_leave_in_one_body_message() -> None:
    first_sent = trio.Event()

    async def stream_in_two_bursts(request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, ((b"content-type", b"text/event-stream"),))
        for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"):
            assert response.write(piece)
        await first_sent.wait()
        response.write(b"data: 4\n\n")
        response.end(b"data: [DONE]\n\n")

    peer = Peer.new(request_message())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(AsgiApp(FnApp(stream_in_two_bursts)), http_scope(), peer.receive, peer.send)
        assert (await peer.sent.receive())["type"] == "http.response.start"
        assert await peer.sent.receive() == body(b"data: 1\n\ndata: 2\n\ndata: 3\n\n", True)
        first_sent.set()
    assert peer.all_sent() == [body(b"data: 4\n\ndata: [DONE]\n\n", False)]


async def test_body_over_the_limit_is_drained_and_answered_413() -> None:
    app = FnApp(answer_json)
    tracker = ConnectionTracker()
    peer = Peer.new(*(request_message(b"x" * 6, more=True) for _ in range(3)), request_message())
    await AsgiApp(app, tracker, max_body_size=10)(http_scope("POST", "/echo"), peer.receive, peer.send)

    assert app.requests == []
    assert peer.unread() == 0
    head, answer = peer.all_sent()
    assert head["status"] == 413
    assert answer["more_body"] is False
    assert orjson.loads(answer["body"]) == {
        "error": {
            "message": "Request body too large: the limit is 10 bytes.",
            "type": "RequestEntityTooLarge",
            "param": None,
            "code": 413,
        }
    }
    assert dict(head["headers"])[b"content-length"] == str(len(answer["body"])).encode()
    assert tracker.statistics().requests_served == 1


async def test_disconnect_mid_stream_cancels_the_handler_and_runs_close_callbacks() -> None:
    closes: list[str] = []
    handler_cancelled = trio.Event()

    async def stream_forever(request: HttpRequest, response: ResponseStream) -> None:
        response.on_close(lambda: closes.append("closed"))
        response.start(200, ())
        response.write(b"data: 1\n\n")
        try:
            await trio.sleep_forever()
        finally:
            assert response.closed
            handler_cancelled.set()

    tracker = ConnectionTracker()
    peer = Peer.new(request_message())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(AsgiApp(FnApp(stream_forever), tracker), http_scope(), peer.receive, peer.send)
        await peer.sent.receive()
        await peer.sent.receive()
        assert tracker.statistics().active_streams == 1
        peer.push({"type": "http.disconnect"})
    assert handler_cancelled.is_set()
    assert closes == ["closed"]
    assert peer.all_sent() == []
    stats = tracker.statistics()
    assert (stats.active_streams, stats.open_connections, stats.requests_served) == (0, 0, 0)


async def test_the_disconnect_hypercorn_reports_from_inside_the_last_send_is_no_abort() -> None:
    """hypercorn delivers ``http.disconnect`` after every complete response, from inside
    the ``more_body=False`` send; that must neither cancel the handler nor the send."""
    may_finish = trio.Event()
    log: list[str] = []

    async def ends_then_works(request: HttpRequest, response: ResponseStream) -> None:
        response.on_close(lambda: log.append("closed"))
        response.start(200, ())
        response.end(b"done")
        await may_finish.wait()
        log.append("after end")

    tracker = ConnectionTracker()
    peer = Peer.new(request_message())

    async def send_like_hypercorn(message: Message) -> None:
        await peer.send(message)
        if message["type"] == "http.response.body" and not message["more_body"]:
            peer.push({"type": "http.disconnect"})
            await trio.testing.wait_all_tasks_blocked()
            may_finish.set()

    await AsgiApp(FnApp(ends_then_works), tracker)(http_scope(), peer.receive, send_like_hypercorn)
    assert log == ["after end"]
    assert peer.all_sent() == [start(200, []), body(b"done", False)]
    assert tracker.statistics().requests_served == 1


async def test_disconnect_after_the_end_but_before_the_last_send_skips_it() -> None:
    handler_cancelled = trio.Event()
    head_sent = trio.Event()

    async def ends_then_waits(request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, ())
        response.write(b"first")
        await head_sent.wait()
        response.end(b"last")
        try:
            await trio.sleep_forever()
        finally:
            handler_cancelled.set()

    tracker = ConnectionTracker()
    peer = Peer.new(request_message())

    async def send_stalling_after_the_first_body(message: Message) -> None:
        await peer.send(message)
        if message.get("body") == b"first":
            peer.push({"type": "http.disconnect"})
            head_sent.set()
            await trio.sleep_forever()

    await AsgiApp(FnApp(ends_then_waits), tracker)(http_scope(), peer.receive, send_stalling_after_the_first_body)
    assert handler_cancelled.is_set()
    assert [m.get("body") for m in peer.all_sent()] == [None, b"first"]
    assert tracker.statistics().requests_served == 0


async def test_disconnect_while_the_body_is_read_never_runs_the_handler() -> None:
    app = FnApp(answer_json)
    tracker = ConnectionTracker()
    peer = Peer.new(request_message(b"{", more=True), {"type": "http.disconnect"})
    await AsgiApp(app, tracker)(http_scope("POST", "/echo"), peer.receive, peer.send)
    assert app.requests == []
    assert peer.all_sent() == []
    assert tracker.statistics().active_streams == 0


async def test_a_hanging_final_send_is_given_up_after_the_timeout(autojump_clock: trio.testing.MockClock) -> None:
    """hypercorn's HTTP/2 final send can block forever after the connection dropped."""

    async def send_hanging_at_the_end(message: Message) -> None:
        if message["type"] == "http.response.body" and not message["more_body"]:
            await trio.sleep_forever()

    peer = Peer.new(request_message())
    asgi = AsgiApp(FnApp(answer_json), final_send_timeout=7.0)
    started = trio.current_time()
    await asgi(http_scope(), peer.receive, send_hanging_at_the_end)
    assert trio.current_time() - started == pytest.approx(7.0)


async def test_a_handler_returning_without_a_response_gets_a_500_envelope() -> None:
    async def forgetful(request: HttpRequest, response: ResponseStream) -> None:
        pass

    peer = Peer.new(request_message())
    await AsgiApp(FnApp(forgetful))(http_scope(), peer.receive, peer.send)
    head, answer = peer.all_sent()
    assert head["status"] == 500
    assert orjson.loads(answer["body"])["error"]["code"] == 500


async def test_a_handler_failing_before_its_head_gets_a_500_envelope() -> None:
    async def failing(request: HttpRequest, response: ResponseStream) -> None:
        raise KeyError("bug")

    tracker = ConnectionTracker()
    peer = Peer.new(request_message())
    await AsgiApp(FnApp(failing), tracker)(http_scope(), peer.receive, peer.send)
    head, answer = peer.all_sent()
    assert head["status"] == 500
    assert orjson.loads(answer["body"])["error"]["type"] == "InternalServerError"
    assert tracker.statistics().requests_served == 1


async def test_a_handler_failing_after_its_head_raises_to_the_server() -> None:
    """Only the server can abort a started response; hypercorn does when the app raises."""

    async def failing_late(request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, ())
        raise KeyError("bug")

    tracker = ConnectionTracker()
    peer = Peer.new(request_message())
    with pytest.RaisesGroup(KeyError):
        await AsgiApp(FnApp(failing_late), tracker)(http_scope(), peer.receive, peer.send)
    stats = tracker.statistics()
    assert (stats.active_streams, stats.open_connections, stats.requests_served) == (0, 0, 0)


async def test_a_started_response_the_handler_left_open_is_ended() -> None:
    async def half_done(request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, ())
        response.write(b"partial")

    peer = Peer.new(request_message())
    await AsgiApp(FnApp(half_done))(http_scope(), peer.receive, peer.send)
    assert peer.all_sent() == [start(200, []), body(b"partial", False)]


async def test_lifespan_acknowledges_startup_and_shutdown() -> None:
    peer = Peer.new({"type": "lifespan.startup"}, {"type": "lifespan.shutdown"})
    await AsgiApp(FnApp(answer_json))({"type": "lifespan", "asgi": {"version": "3.0"}}, peer.receive, peer.send)
    assert peer.all_sent() == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]


# --- AsgiResponseStream on its own ----------------------------------------------------


def test_write_reports_the_high_water_mark_and_drain_wakes_the_producer() -> None:
    stream = AsgiResponseStream(high_water=10, low_water=4)
    stream.start(200, ())
    assert stream.write(b"123456789")
    assert not stream.write(b"0")
    drained: list[bool] = []
    stream.on_drained(lambda: drained.append(True))
    assert stream.take_all() == b"1234567890"
    stream.write(b"abcd")
    stream.flushed()
    assert drained == []
    stream.take_all()
    stream.flushed()
    assert drained == [True]


def test_on_drained_runs_at_once_below_the_low_water_mark() -> None:
    stream = AsgiResponseStream(high_water=10, low_water=4)
    stream.start(200, ())
    stream.write(b"abc")
    drained: list[bool] = []
    stream.on_drained(lambda: drained.append(True))
    assert drained == [True]


def test_close_callbacks_run_once_and_only_if_the_client_left_before_the_end() -> None:
    calls: list[str] = []
    left = AsgiResponseStream()
    left.on_close(lambda: calls.append("early"))
    left.abort()
    left.abort()
    left.on_close(lambda: calls.append("late"))
    assert calls == ["early", "late"]
    assert left.closed

    calls.clear()
    finished = AsgiResponseStream()
    finished.on_close(lambda: calls.append("never"))
    finished.start(200, ())
    finished.end(b"done")
    finished.abort()
    finished.on_close(lambda: calls.append("never"))
    assert calls == []


def test_writes_after_the_client_left_are_dropped() -> None:
    stream = AsgiResponseStream(high_water=4)
    stream.start(200, ())
    stream.abort()
    assert stream.write(b"more than four bytes")
    stream.end(b"x")
    assert stream.take_all() == b""
    assert stream.closed


def test_misuse_is_an_error() -> None:
    stream = AsgiResponseStream()
    with pytest.raises(RuntimeError):
        stream.write(b"x")
    stream.start(200, ())
    with pytest.raises(RuntimeError):
        stream.start(200, ())
    stream.end()
    with pytest.raises(RuntimeError):
        stream.end()
    assert stream.ended and not stream.closed
    stream.finish()
    assert stream.closed
