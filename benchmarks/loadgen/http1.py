"""HTTP/1.1 keep-alive connections, one streaming request at a time.

The response parser is hand-rolled: h11 costs several Python calls per body chunk, and
at tens of thousands of SSE events per second that alone would make the client the
bottleneck.  It understands exactly what a streaming server sends: a status line,
headers, then a chunked, Content-Length or close-delimited body.
"""

from __future__ import annotations

import time

import trio

from benchmarks.loadgen.plan import RECONNECT_PAUSE, Plan, sleep_until
from benchmarks.loadgen.records import StreamRecord
from benchmarks.loadgen.sse import ErrorBody, SseReader, body_reader

__all__ = ["ResponseParser", "request_bytes", "run_h1_connection"]

RECEIVE_SIZE = 1 << 18

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)


def request_bytes(plan: Plan) -> bytes:
    head = (
        f"POST {plan.path} HTTP/1.1\r\nHost: {plan.host}:{plan.port}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(plan.body)}\r\n\r\n"
    )
    return head.encode("ascii") + plan.body


class ResponseParser:
    """One response, fed in pieces; ``complete`` once its body has ended."""

    __slots__ = ("_body", "_buffer", "_remaining", "_state", "keep_alive", "record")

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self.keep_alive = True
        self._state = _HEAD
        self._buffer = b""
        self._remaining = 0
        self._body: SseReader | ErrorBody | None = None

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes, now: float) -> None:
        """Consume bytes that arrived at ``now``; raises ValueError on a malformed response.

        The body bytes found in one read are joined and handed to the body reader once,
        so the per-chunk cost is only the framing arithmetic.
        """
        buffer = self._buffer + data if self._buffer else data
        pieces: list[bytes] = []
        position = 0
        size = len(buffer)
        while position < size:
            state = self._state
            if state in (_CHUNK_DATA, _LENGTH):
                take = min(self._remaining, size - position)
                pieces.append(buffer[position : position + take])
                position += take
                self._remaining -= take
                if self._remaining == 0:
                    if state == _LENGTH:
                        self._state = self._end(pieces, now)
                    else:
                        self._state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:
                if size - position < 2:
                    break
                position += 2
                self._state = _CHUNK_SIZE
            elif state == _CHUNK_SIZE:
                end = buffer.find(b"\r\n", position)
                if end < 0:
                    break
                chunk = int(buffer[position:end].split(b";", 1)[0], 16)
                position = end + 2
                self._remaining = chunk
                self._state = _CHUNK_DATA if chunk else _TRAILERS
            elif state == _UNTIL_CLOSE:
                pieces.append(buffer[position:])
                position = size
            elif state == _TRAILERS:
                if buffer.startswith(b"\r\n", position):
                    position += 2
                else:
                    end = buffer.find(b"\r\n\r\n", position)
                    if end < 0:
                        break
                    position = end + 4
                self._state = self._end(pieces, now)
            elif state == _HEAD:
                end = buffer.find(b"\r\n\r\n", position)
                if end < 0:
                    break
                self._head(buffer[position:end], now)
                position = end + 4
                if self._state == _DONE:
                    self._end(pieces, now)
            else:
                raise ValueError(f"{size - position} bytes after the end of the response")
        if pieces:
            self._body.feed(b"".join(pieces), now)  # type: ignore[union-attr]
        self._buffer = buffer[position:]

    def eof(self, now: float) -> None:
        """The server closed the connection: fine only for a close-delimited body."""
        if self._state == _UNTIL_CLOSE:
            self._state = self._end([], now)
        else:
            self.record.fail("connection closed mid-response", now)

    def _head(self, head: bytes, now: float) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
            raise ValueError(f"bad status line {status_line[:80]!r}")
        self.record.status = int(status_line[9:12])
        chunked, length = False, -1
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection" and value == b"close":
                self.keep_alive = False
        self._body = body_reader(self.record)
        if chunked:
            self._state = _CHUNK_SIZE
        elif length >= 0:
            self._remaining = length
            self._state = _LENGTH if length else _DONE
        else:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE

    def _end(self, pieces: list[bytes], now: float) -> int:
        """The body is complete: deliver what is pending, then finish it."""
        body = self._body
        if pieces:
            body.feed(b"".join(pieces), now)  # type: ignore[union-attr]
            pieces.clear()
        body.finish(now)  # type: ignore[union-attr]
        return _DONE


async def run_h1_connection(plan: Plan, first_start: float) -> None:
    """Keep one connection busy with back-to-back streams until the plan stops."""
    await sleep_until(first_start)
    request = request_bytes(plan)
    while plan.may_start():
        try:
            stream = await trio.open_tcp_stream(plan.host, plan.port)
        except OSError as exc:
            plan.failed_attempt(f"connect: {exc}")
            await trio.sleep(RECONNECT_PAUSE)
            continue
        async with stream:
            await _requests(stream, plan, request)


async def _requests(stream: trio.SocketStream, plan: Plan, request: bytes) -> None:
    """Requests on one connection until it must close, fails, or the plan stops."""
    while plan.may_start():
        parser = ResponseParser(plan.new_record())
        try:
            await stream.send_all(request)
            while not parser.complete:
                data = await stream.receive_some(RECEIVE_SIZE)
                now = time.perf_counter()
                if not data:
                    parser.eof(now)
                    return
                parser.feed(data, now)
        except (trio.BrokenResourceError, OSError, ValueError) as exc:
            parser.record.fail(f"{type(exc).__name__}: {exc}", time.perf_counter())
            return
        if not parser.keep_alive:
            return
