"""A trivial server that streams chat chunks as fast as the socket takes them.

It exists to measure the load generator's own ceiling: every response is pre-rendered
bytes (one HTTP/1.1 chunk or one HTTP/2 DATA frame per SSE event, as real token-by-token
servers send them), so the server does almost no work per event and the client is the
bottleneck.  HTTP/1.1 and h2c with prior knowledge on the same port.

It is not a conforming HTTP/2 server: it ignores the client's flow-control windows (our
load generator and h2load both grant about 2 GiB) and never decodes request headers.

    python -m benchmarks.loadgen.blaster --port 8002
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import signal
import struct

import orjson
import trio

__all__ = ["main", "render_events"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8
#: HPACK: ":status: 200" (static index 8), then content-type (static name 31) as a literal.
_RESPONSE_BLOCK = b"\x88\x0f\x10\x11text/event-stream"
_FRAME = struct.Struct(">HBBBI")
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
    """Pre-rendered responses per token count: an HTTP/1.1 message, an HTTP/2 frame template."""

    def __init__(self) -> None:
        self._h1: dict[int, bytes] = {}
        self._h2: dict[int, tuple[bytes, list[int]]] = {}

    def h1(self, tokens: int) -> bytes:
        if tokens not in self._h1:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in render_events(tokens))
            self._h1[tokens] = head + body + b"0\r\n\r\n"
        return self._h1[tokens]

    def h2(self, tokens: int, stream_id: int) -> bytes:
        if tokens not in self._h2:
            events = render_events(tokens)
            frames = [_frame(_HEADERS, _END_HEADERS, 0, _RESPONSE_BLOCK)]
            frames += [_frame(_DATA, _END_STREAM if i == len(events) - 1 else 0, 0, e) for i, e in enumerate(events)]
            offsets, position = [], 0
            for frame in frames:
                offsets.append(position + 5)
                position += len(frame)
            self._h2[tokens] = (b"".join(frames), offsets)
        template, offsets = self._h2[tokens]
        out = bytearray(template)
        for offset in offsets:
            struct.pack_into(">I", out, offset, stream_id)
        return bytes(out)


def _max_tokens(body: bytes) -> int:
    try:
        value = orjson.loads(body).get("max_tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return 16
    return value if isinstance(value, int) and value > 0 else 16


async def _handle(stream: trio.SocketStream, responses: _Responses) -> None:
    buffer = b""
    try:
        while len(buffer) < len(PREFACE):
            data = await stream.receive_some(65536)
            if not data:
                return
            buffer += data
            if not PREFACE.startswith(buffer[: len(PREFACE)]):
                break
        if buffer.startswith(PREFACE):
            await _serve_h2(stream, buffer[len(PREFACE) :], responses)
        else:
            await _serve_h1(stream, buffer, responses)
    except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
        pass


async def _serve_h1(stream: trio.SocketStream, buffer: bytes, responses: _Responses) -> None:
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
        await stream.send_all(responses.h1(_max_tokens(body)))


async def _serve_h2(stream: trio.SocketStream, buffer: bytes, responses: _Responses) -> None:
    settings = struct.pack(">HI", 0x3, 1 << 20)  # MAX_CONCURRENT_STREAMS
    await stream.send_all(_frame(_SETTINGS, 0, 0, settings))
    bodies: dict[int, bytes] = {}
    while True:
        out: list[bytes] = []
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
                out.append(responses.h2(_max_tokens(bodies.pop(stream_id)), stream_id))
        buffer = buffer[position:]
        if out:
            await stream.send_all(b"".join(out))
        data = await stream.receive_some(65536)
        if not data:
            return
        buffer += data


async def _serve(port: int) -> None:
    responses = _Responses()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            serve_tcp = functools.partial(trio.serve_tcp, functools.partial(_handle, responses=responses), port, host="127.0.0.1")
            listeners = await nursery.start(serve_tcp)
            print(f"listening on http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: any free port)")
    trio.run(_serve, parser.parse_args().port)


if __name__ == "__main__":
    main()
