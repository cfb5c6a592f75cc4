"""A trivial server that streams chat chunks as fast as the socket takes them.

It exists to measure the load generator's own ceiling: every response is pre-rendered
bytes (one HTTP/1.1 chunk or one HTTP/2 DATA frame per SSE event, as real token-by-token
servers send them), so the server does almost no work per event and the client is the
bottleneck.  HTTP/1.1 and h2c with prior knowledge on the same port.

With ``--ttft``/``--itl`` it paces instead: each stream's first token (with the role
chunk) after TTFT, then one token per ITL on an exact schedule, sent by one task per
connection that writes every due event in one go.  That is an ideal simulated server
at almost no CPU cost, so it shows what latency the load generator itself adds.

It is not a conforming HTTP/2 server: it ignores the client's flow-control windows (our
load generator and h2load both grant about 2 GiB) and never decodes request headers.

    python -m benchmarks.loadgen.blaster --port 8002 [--ttft 0.1 --itl 0.02]
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import json
import re
import signal
import struct
from collections.abc import Callable

import attrs
import orjson
import trio

__all__ = ["Pace", "main", "render_events"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8
#: HPACK: ":status: 200" (static index 8), then content-type (static name 31) as a literal.
_RESPONSE_BLOCK = b"\x88\x0f\x10\x11text/event-stream"
_FRAME = struct.Struct(">HBBBI")
_H1_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)", re.IGNORECASE)


def render_events(tokens: int) -> list[bytes]:
    """The SSE events of a chat stream of ``tokens`` tokens, shaped like vLLM's."""
    head = {"id": "chatcmpl-blaster", "object": "chat.completion.chunk", "created": 0, "model": "blaster"}

    def choice(delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks: list[object] = [choice({"role": "assistant", "content": ""})]
    chunks += [choice({"content": " token"}) for _ in range(tokens)]
    chunks += [choice({}, "length"), {**head, "choices": [], "usage": {"completion_tokens": tokens}}]
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    length = len(payload)
    return _FRAME.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


class _Responses:
    """Pre-rendered responses per token count.

    Whole responses serve the unpaced mode; *groups* -- the events that leave together,
    the role chunk with the first token and the closing chunks with the last -- serve
    the paced mode.
    """

    def __init__(self) -> None:
        self._groups: dict[int, list[list[bytes]]] = {}
        self._h1: dict[int, bytes] = {}
        self._h2: dict[int, tuple[bytes, list[int]]] = {}

    def groups(self, tokens: int) -> list[list[bytes]]:
        if tokens not in self._groups:
            events = render_events(tokens)
            groups = [events[:2]] + [[event] for event in events[2 : tokens + 1]]
            groups[-1] = groups[-1] + events[tokens + 1 :]
            self._groups[tokens] = groups
        return self._groups[tokens]

    def h1(self, tokens: int) -> bytes:
        if tokens not in self._h1:
            self._h1[tokens] = b"".join(self.h1_group(tokens, i) for i in range(len(self.groups(tokens))))
        return self._h1[tokens]

    def h1_group(self, tokens: int, index: int) -> bytes:
        groups = self.groups(tokens)
        body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in groups[index])
        head = _H1_HEAD if index == 0 else b""
        return head + body + (b"0\r\n\r\n" if index == len(groups) - 1 else b"")

    def h2(self, tokens: int, stream_id: int) -> bytes:
        if tokens not in self._h2:
            frames = [self.h2_group(tokens, i, 0) for i in range(len(self.groups(tokens)))]
            template = b"".join(frames)
            offsets, position = [], 0
            while position < len(template):
                offsets.append(position + 5)
                position += 9 + int.from_bytes(template[position : position + 3], "big")
            self._h2[tokens] = (template, offsets)
        template, offsets = self._h2[tokens]
        out = bytearray(template)
        for offset in offsets:
            struct.pack_into(">I", out, offset, stream_id)
        return bytes(out)

    def h2_group(self, tokens: int, index: int, stream_id: int) -> bytes:
        groups = self.groups(tokens)
        frames = [_frame(_HEADERS, _END_HEADERS, stream_id, _RESPONSE_BLOCK)] if index == 0 else []
        events = groups[index]
        last = index == len(groups) - 1
        for i, event in enumerate(events):
            frames.append(_frame(_DATA, _END_STREAM if last and i == len(events) - 1 else 0, stream_id, event))
        return b"".join(frames)


@attrs.frozen
class Pace:
    """Simulated latencies in seconds; both 0 means: stream everything at once."""

    ttft: float = 0.0
    itl: float = 0.0

    @property
    def paced(self) -> bool:
        return self.ttft > 0 or self.itl > 0


Render = Callable[[int, int, int], bytes]  # (stream key, tokens, group index) -> bytes


class _Pacer:
    """Sends every stream's groups of one connection on schedule, all due ones in one write."""

    def __init__(
        self, stream: trio.SocketStream, send_lock: trio.Lock, pace: Pace, responses: _Responses, render: Render
    ) -> None:
        self._stream, self._lock, self._pace = stream, send_lock, pace
        self._responses, self._render = responses, render
        self._due: list[tuple[float, int, int, int, int]] = []  # (due, order, key, tokens, group)
        self._order = itertools.count()
        self._wake = trio.Event()

    def add(self, key: int, tokens: int) -> None:
        heapq.heappush(self._due, (trio.current_time() + self._pace.ttft, next(self._order), key, tokens, 0))
        self._wake.set()

    async def run(self) -> None:
        due = self._due
        while True:
            self._wake = trio.Event()
            if not due:
                await self._wake.wait()
                continue
            if due[0][0] > trio.current_time():
                with trio.move_on_at(due[0][0]):
                    await self._wake.wait()
                continue
            now = trio.current_time()
            out = []
            while due and due[0][0] <= now:
                at, order, key, tokens, group = heapq.heappop(due)
                out.append(self._render(key, tokens, group))
                if group + 1 < len(self._responses.groups(tokens)):
                    heapq.heappush(due, (at + self._pace.itl, order, key, tokens, group + 1))
            try:
                async with self._lock:
                    await self._stream.send_all(b"".join(out))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


def _max_tokens(body: bytes) -> int:
    try:
        value = orjson.loads(body).get("max_tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return 16
    return value if isinstance(value, int) and value > 0 else 16


async def _handle(stream: trio.SocketStream, responses: _Responses, pace: Pace) -> None:
    buffer = b""
    try:
        while len(buffer) < len(PREFACE):
            data = await stream.receive_some(65536)
            if not data:
                return
            buffer += data
            if not PREFACE.startswith(buffer[: len(PREFACE)]):
                break
    except trio.BrokenResourceError:
        return
    http2 = buffer.startswith(PREFACE)
    connection = _Connection(stream, responses, pace, http2)
    async with trio.open_nursery() as nursery:
        if connection.pacer is not None:
            nursery.start_soon(connection.pacer.run)
        try:
            if http2:
                await connection.serve_h2(buffer[len(PREFACE) :])
            else:
                await connection.serve_h1(buffer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
            pass  # the client went away or sent garbage: drop the connection
        nursery.cancel_scope.cancel()


class _Connection:
    """One client connection: its reader, and its pacer when the blaster paces."""

    def __init__(self, stream: trio.SocketStream, responses: _Responses, pace: Pace, http2: bool) -> None:
        self.stream = stream
        self.responses = responses
        self.send_lock = trio.Lock()
        render: Render = self._h2_group if http2 else self._h1_group
        self.pacer = _Pacer(stream, self.send_lock, pace, responses, render) if pace.paced else None

    def _h1_group(self, key: int, tokens: int, index: int) -> bytes:
        return self.responses.h1_group(tokens, index)

    def _h2_group(self, key: int, tokens: int, index: int) -> bytes:
        return self.responses.h2_group(tokens, index, key)

    async def send(self, data: bytes) -> None:
        async with self.send_lock:
            await self.stream.send_all(data)

    async def serve_h1(self, buffer: bytes) -> None:
        stream = self.stream
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
                continue
            match = _CONTENT_LENGTH.search(buffer, 0, end + 2)
            length = int(match.group(1)) if match else 0
            while len(buffer) < end + 4 + length:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            body, buffer = buffer[end + 4 : end + 4 + length], buffer[end + 4 + length :]
            tokens = _max_tokens(body)
            if self.pacer is not None:
                self.pacer.add(0, tokens)
            else:
                await self.send(self.responses.h1(tokens))

    async def serve_h2(self, buffer: bytes) -> None:
        settings = struct.pack(">HI", 0x3, 1 << 20)  # MAX_CONCURRENT_STREAMS
        await self.send(_frame(_SETTINGS, 0, 0, settings))
        bodies: dict[int, bytes] = {}
        while True:
            out: list[bytes] = []
            received = 0
            position = 0
            while len(buffer) - position >= 9:
                high, low, kind, flags, stream_id = _FRAME.unpack_from(buffer, position)
                length = (high << 8) | low
                if len(buffer) - position < 9 + length:
                    break
                payload = buffer[position + 9 : position + 9 + length]
                position += 9 + length
                stream_id &= 0x7FFFFFFF
                if kind == _DATA:
                    received += length
                    if flags & _PADDED:
                        payload = payload[1 : len(payload) - payload[0]]
                    bodies[stream_id] = bodies.get(stream_id, b"") + payload
                elif kind == _HEADERS:
                    bodies.setdefault(stream_id, b"")
                elif kind == _SETTINGS and not flags & _ACK:
                    out.append(_frame(_SETTINGS, _ACK, 0, b""))
                elif kind == _PING and not flags & _ACK:
                    out.append(_frame(_PING, _ACK, 0, payload))
                elif kind == _RST_STREAM:
                    bodies.pop(stream_id, None)
                elif kind == _GOAWAY:
                    return
                if kind in (_DATA, _HEADERS) and flags & _END_STREAM and stream_id in bodies:
                    tokens = _max_tokens(bodies.pop(stream_id))
                    if self.pacer is not None:
                        self.pacer.add(stream_id, tokens)
                    else:
                        out.append(self.responses.h2(tokens, stream_id))
            buffer = buffer[position:]
            if received:  # request bodies use up the connection window: give it back
                out.append(_frame(_WINDOW_UPDATE, 0, 0, struct.pack(">I", received)))
            if out:
                await self.send(b"".join(out))
            data = await self.stream.receive_some(65536)
            if not data:
                return
            buffer += data


async def _serve(port: int, pace: Pace) -> None:
    responses = _Responses()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            serve_tcp = functools.partial(
                trio.serve_tcp, functools.partial(_handle, responses=responses, pace=pace), port, host="127.0.0.1"
            )
            listeners = await nursery.start(serve_tcp)
            print(f"listening on http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--ttft", type=float, default=0.0, help="seconds to the first token (default: none)")
    parser.add_argument("--itl", type=float, default=0.0, help="seconds between tokens (default: none)")
    args = parser.parse_args()
    trio.run(_serve, args.port, Pace(args.ttft, args.itl))


if __name__ == "__main__":
    main()
