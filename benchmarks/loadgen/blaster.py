"""A trivial server that streams chat chunks as fast as the socket takes them.

It exists to measure the load generator's own ceiling: every response is pre-rendered
bytes (one HTTP/1.1 chunk or one HTTP/2 DATA frame per SSE event, as real token-by-token
servers send them), so the server does almost no work per event and the client is the
bottleneck.  HTTP/1.1 and h2c with prior knowledge on the same port.

With ``--ttft``/``--itl`` it paces instead: each stream's first token (with the role
chunk) after TTFT, then one token per ITL, on llmsim's 2 ms step grid (each at the grid
time nearest its deadline, as llmsim rounds: no bias on average; ITLs exact).  One task for the whole server sends
every due event of a grid tick, one write per connection (:mod:`.pacer`).  That is an
ideal simulated server at almost no CPU cost, rounding like llmsim, so it shows what
latency the load generator itself adds and what llmsim adds on top of it.

It is not a conforming HTTP/2 server: it ignores the client's flow-control windows (our
load generator and h2load both grant about 2 GiB) and never decodes request headers.

    python -m benchmarks.loadgen.blaster --port 8002 [--ttft 0.1 --itl 0.02]
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import signal
import struct
from collections.abc import Callable

import orjson
import trio

from benchmarks.loadgen.pacer import Output, Pace, Pacer

__all__ = ["Pace", "main", "render_events", "serve_connection"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8
#: HPACK: ":status: 200" (static index 8), then content-type (static name 31) as a literal.
_RESPONSE_BLOCK = b"\x88\x0f\x10\x11text/event-stream"
_FRAME = struct.Struct(">HBBBI")
_U32 = struct.Struct(">I")
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


class _Template:
    """HTTP/2 frames rendered for stream 0 and cut around their stream-id fields, so that
    rendering them for a stream is a single join with its packed id."""

    __slots__ = ("_pieces",)

    def __init__(self, frames: bytes) -> None:
        self._pieces, start, position = [], 0, 0
        while position < len(frames):
            self._pieces.append(frames[start : position + 5])
            start = position + 9
            position = start + int.from_bytes(frames[position : position + 3], "big")
        self._pieces.append(frames[start:])

    def render(self, stream_id: int) -> bytes:
        return _U32.pack(stream_id).join(self._pieces)


class Responses:
    """Pre-rendered responses per token count.

    Whole responses serve the unpaced mode; *groups* -- the events that leave together,
    the role chunk with the first token and the closing chunks with the last -- serve
    the paced mode as (first, middle, last) triples: every middle group is the same
    token chunk, so a stream needs three pre-rendered byte strings, not one per event.
    """

    def __init__(self) -> None:
        self._groups: dict[int, list[list[bytes]]] = {}
        self._h1: dict[int, bytes] = {}
        self._h1_paced: dict[int, tuple[bytes, bytes, bytes]] = {}
        self._h2: dict[int, _Template] = {}
        self._h2_paced: dict[int, tuple[_Template, _Template, _Template]] = {}

    def groups(self, tokens: int) -> list[list[bytes]]:
        if tokens not in self._groups:
            events = render_events(tokens)
            groups = [events[:2]] + [[event] for event in events[2 : tokens + 1]]
            groups[-1] = groups[-1] + events[tokens + 1 :]
            self._groups[tokens] = groups
        return self._groups[tokens]

    def h1(self, tokens: int) -> bytes:
        if tokens not in self._h1:
            self._h1[tokens] = b"".join(self.h1_group(tokens, i) for i in range(tokens))
        return self._h1[tokens]

    def h1_paced(self, tokens: int) -> tuple[bytes, bytes, bytes]:
        """The paced groups of an HTTP/1.1 response, shared by every stream."""
        if tokens not in self._h1_paced:
            self._h1_paced[tokens] = _triple(functools.partial(self.h1_group, tokens), tokens)
        return self._h1_paced[tokens]

    def h2(self, tokens: int, stream_id: int) -> bytes:
        if tokens not in self._h2:
            self._h2[tokens] = _Template(b"".join(self.h2_group(tokens, i) for i in range(tokens)))
        return self._h2[tokens].render(stream_id)

    def h2_paced(self, tokens: int, stream_id: int) -> tuple[bytes, bytes, bytes]:
        """The paced groups of an HTTP/2 response, rendered per stream (its id is in every frame)."""
        if tokens not in self._h2_paced:
            first, middle, last = _triple(functools.partial(self.h2_group, tokens), tokens)
            self._h2_paced[tokens] = (_Template(first), _Template(middle), _Template(last))
        first, middle, last = self._h2_paced[tokens]
        return first.render(stream_id), middle.render(stream_id), last.render(stream_id)

    def h1_group(self, tokens: int, index: int) -> bytes:
        groups = self.groups(tokens)
        body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in groups[index])
        head = _H1_HEAD if index == 0 else b""
        return head + body + (b"0\r\n\r\n" if index == len(groups) - 1 else b"")

    def h2_group(self, tokens: int, index: int) -> bytes:
        """Group ``index`` as HTTP/2 frames of stream 0 (see :class:`_Template`)."""
        groups = self.groups(tokens)
        frames = [_frame(_HEADERS, _END_HEADERS, 0, _RESPONSE_BLOCK)] if index == 0 else []
        events = groups[index]
        last = index == len(groups) - 1
        for i, event in enumerate(events):
            frames.append(_frame(_DATA, _END_STREAM if last and i == len(events) - 1 else 0, 0, event))
        return b"".join(frames)


def _triple(render: Callable[[int], bytes], count: int) -> tuple[bytes, bytes, bytes]:
    """(first, middle, last) of ``count`` groups; the middle one is unused below 3."""
    return render(0), render(1) if count > 2 else b"", render(count - 1)


def _max_tokens(body: bytes) -> int:
    try:
        value = orjson.loads(body).get("max_tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return 16
    return value if isinstance(value, int) and value > 0 else 16


async def serve_connection(stream: trio.SocketStream, responses: Responses, pacer: Pacer | None) -> None:
    """Serve one client connection (HTTP/2 if it starts with the preface) until it ends."""
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
    connection = _Connection(stream, responses, pacer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.output.run)
        try:
            if http2:
                await connection.serve_h2(buffer[len(PREFACE) :])
            else:
                await connection.serve_h1(buffer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
            pass  # the client went away or sent garbage: drop the connection
        finally:
            connection.output.close()  # before the socket closes: the pacer must skip it
            nursery.cancel_scope.cancel()


class _Connection:
    """One client connection: its reader; responses go to its :class:`Output`."""

    def __init__(self, stream: trio.SocketStream, responses: Responses, pacer: Pacer | None) -> None:
        self.stream = stream
        self.responses = responses
        self.pacer = pacer
        self.output = Output(stream)

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
                self.pacer.add(self.output, self.responses.h1_paced(tokens), tokens)
            else:
                await self.output.send(self.responses.h1(tokens))

    async def serve_h2(self, buffer: bytes) -> None:
        settings = struct.pack(">HI", 0x3, 1 << 20)  # MAX_CONCURRENT_STREAMS
        await self.output.send(_frame(_SETTINGS, 0, 0, settings))
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
                        self.pacer.add(self.output, self.responses.h2_paced(tokens, stream_id), tokens)
                    else:
                        out.append(self.responses.h2(tokens, stream_id))
            buffer = buffer[position:]
            if received:  # request bodies use up the connection window: give it back
                out.append(_frame(_WINDOW_UPDATE, 0, 0, struct.pack(">I", received)))
            if out:
                await self.output.send(b"".join(out))
            data = await self.stream.receive_some(65536)
            if not data:
                return
            buffer += data


async def _serve(port: int, pace: Pace) -> None:
    responses = Responses()
    pacer = Pacer(pace) if pace.paced else None
    handler = functools.partial(serve_connection, responses=responses, pacer=pacer)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            if pacer is not None:
                nursery.start_soon(pacer.run)
            listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, port, host="127.0.0.1"))
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
