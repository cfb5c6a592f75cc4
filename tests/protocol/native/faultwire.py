"""Helpers of the ``x-llmsim-fault`` tests: a simulator on a free port, an h2 client
that records every frame it receives (raw, as parsed by hyperframe), the raw bytes of an
HTTP/1.1 exchange, and what httpx yields.

The server is a whole simulator (``Simulator`` behind the native backend) streaming
``/v1/completions`` with ``ignore_eos`` at a 5 ms token pace, so each token is one
write, i.e. one event; the faults count those.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.exceptions
import httpx
import trio
from hpack import Decoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.protocol.settings import ServerHandle
from llmsim.server import _serve_backend
from tests.protocol.helpers import split_frames

MODEL = "llmsim/sim-model"


@attrs.frozen
class Server:
    handle: ServerHandle
    sim: Simulator
    _clients: list[RawH2] = attrs.field(factory=list)

    async def h2(self) -> RawH2:
        """A raw h2 client connection to this server, closed when the simulator stops."""
        client = await RawH2.connect(self.handle.port)
        self._clients.append(client)
        return client

    async def close_clients(self) -> None:
        """Close our side of every client connection: the server's shutdown would otherwise
        give each (a peer that neither reads nor closes) ``CLOSE_LINGER``, 1 s, to close."""
        for client in self._clients:
            await client.stream.aclose()


@asynccontextmanager
async def simulator(**overrides: Any) -> AsyncIterator[Server]:
    """A simulator on a free port (as ``llmsim.testing.open_simulator``), with its engine
    reachable for the statistics."""
    config = Config(**{"port": 0, "time_to_first_token": 0.005, "inter_token_latency": 0.005, **overrides})
    sim = Simulator(config)
    with trio.fail_after(20):  # a fault that never fires must fail the test, not hang it
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(partial(_serve_backend, sim, config))
            server = Server(handle, sim)
            try:
                yield server
            finally:
                await server.close_clients()
            nursery.cancel_scope.cancel()


def completion(max_tokens: int) -> bytes:
    return json.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    ).encode()


# --- HTTP/2: every frame as it arrives ----------------------------------------------------


@attrs.frozen
class Wire:
    """One received frame: type, flags, stream, payload length, and for RST_STREAM and
    GOAWAY the error code (GOAWAY: also last-stream-id), for HEADERS the fields."""

    kind: str
    flags: frozenset[str]
    stream_id: int
    length: int
    code: int | None = None
    last_stream_id: int | None = None
    fields: tuple[tuple[bytes, bytes], ...] = ()
    data: bytes = b""
    pad: int = 0  # DATA: padding bytes
    value: object = None  # PING: opaque data; SETTINGS: the settings; WINDOW_UPDATE: the increment


@attrs.define(eq=False)
class RawH2:
    """An h2 client connection that sends with h2 and reads raw frames (never acking
    DATA: the responses here stay far below the default window)."""

    stream: trio.SocketStream
    conn: h2.connection.H2Connection = attrs.field(
        factory=lambda: h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    )
    frames: list[Wire] = attrs.field(factory=list)
    eof: bool = False
    _decoder: Decoder = attrs.field(factory=Decoder)
    _buffer: bytes = b""
    _block: bytes = b""  # a header block still arriving (HEADERS without END_HEADERS)

    @classmethod
    async def connect(cls, port: int) -> RawH2:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        client.conn.initiate_connection()
        await client.stream.send_all(client.conn.data_to_send())
        return client

    async def post(self, fault: str | None, max_tokens: int = 4, path: str = "/v1/completions") -> int:
        sid = self.conn.get_next_available_stream_id()
        body = completion(max_tokens)
        headers = [(b":method", b"POST"), (b":path", path.encode()), (b":scheme", b"http"), (b":authority", b"t")]
        headers.append((b"content-type", b"application/json"))
        if fault is not None:
            headers.append((b"x-llmsim-fault", fault.encode()))
        self.conn.send_headers(sid, headers)
        self.conn.send_data(sid, body, end_stream=True)
        await self.stream.send_all(self.conn.data_to_send())
        return sid

    async def read_until(self, done: Any) -> None:
        while not done(self.frames) and not self.eof:
            data = await self.stream.receive_some(65536)
            if not data:
                self.eof = True
            self._parse(data)

    def _parse(self, data: bytes) -> None:
        frames, self._buffer = split_frames(self._buffer + data)
        self.frames += [self._wire(frame, length) for frame, length in frames]

    def _wire(self, frame: Frame, length: int) -> Wire:
        wire = Wire(type(frame).__name__.removesuffix("Frame"), frozenset(frame.flags), frame.stream_id, length)
        if isinstance(frame, (RstStreamFrame, GoAwayFrame)):
            wire = attrs.evolve(wire, code=frame.error_code)
        if isinstance(frame, GoAwayFrame):
            wire = attrs.evolve(wire, last_stream_id=frame.last_stream_id)
        if isinstance(frame, (HeadersFrame, ContinuationFrame)):
            self._block += frame.data
            if "END_HEADERS" in frame.flags:
                block, self._block = self._block, b""
                wire = attrs.evolve(wire, fields=tuple(self._decoder.decode(block, raw=True)))
        if isinstance(frame, DataFrame):
            wire = attrs.evolve(wire, data=bytes(frame.data), pad=frame.pad_length)
        if isinstance(frame, PingFrame):
            wire = attrs.evolve(wire, value=bytes(frame.opaque_data))
        if isinstance(frame, SettingsFrame):
            wire = attrs.evolve(wire, value=dict(frame.settings))
        if isinstance(frame, WindowUpdateFrame):
            wire = attrs.evolve(wire, value=frame.window_increment)
        return wire

    def on(self, sid: int) -> list[Wire]:
        """The frames of stream ``sid``."""
        return [frame for frame in self.frames if frame.stream_id == sid]


def closed(sid: int) -> Any:
    """Stop reading once stream ``sid`` has ended or been reset."""
    return lambda frames: any(f.stream_id == sid and (f.kind == "RstStream" or "END_STREAM" in f.flags) for f in frames)


def shape(frames: list[Wire]) -> list[tuple[str, frozenset[str], int | None]]:
    return [(f.kind, f.flags, f.code) for f in frames]


def events(frames: list[Wire]) -> list[bytes]:
    return [f.data for f in frames if f.kind == "Data" and f.data]


HEAD = ("Headers", frozenset({"END_HEADERS"}), None)
DATA = ("Data", frozenset(), None)
END = ("Data", frozenset({"END_STREAM"}), None)


def body(frames: list[Wire]) -> bytes:
    return b"".join(events(frames))


def assert_one_event_per_frame(frames: list[Wire]) -> None:
    """Each DATA frame is one write: whole SSE events (usually one; two when the engine
    fell behind and wrote two tokens at once), never a piece of one."""
    for data in events(frames):
        assert data.startswith(b"data: ") and data.endswith(b"\n\n"), data


# --- HTTP/1.1: the raw bytes ----------------------------------------------------------------


async def http1(port: int, fault: str, max_tokens: int = 3, *, close: bool = True) -> bytes:
    """Everything the server sends for one request, to its close (``close``: the request
    asks for one; the 2 s bound only stops a server that neither closes nor is asked to)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    body = completion(max_tokens)
    connection = "connection: close\r\n" if close else ""
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: t\r\n{connection}content-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-llmsim-fault: {fault}\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)
    received = b""
    with trio.move_on_after(2):
        while data := await stream.receive_some(65536):
            received += data
    await stream.aclose()
    return received


def chunks(raw: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(head, the chunks' payloads, what follows the last complete chunk)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    payloads = []
    while rest and b"\r\n" in rest:
        size_line, _, after = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0 or len(after) < size + 2:
            break
        payloads.append(after[:size])
        rest = after[size + 2 :]
    return head, payloads, rest


# --- what httpx does ------------------------------------------------------------------------


async def httpx_stream(port: int, fault: str, *, http2: bool) -> tuple[list[str], BaseException | None]:
    """The SSE lines httpx yields, and what it raised (if anything)."""
    lines: list[str] = []
    # verify=False: plain HTTP, and a client that verifies loads the CA bundle first (0.1 s)
    base_url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(http1=not http2, http2=http2, base_url=base_url, verify=False) as client:
        try:
            async with client.stream(
                "POST",
                "/v1/completions",
                content=completion(50),
                headers={"x-llmsim-fault": fault, "content-type": "application/json"},
            ) as response:
                async for line in response.aiter_lines():
                    if line:
                        lines.append(line)
        except (httpx.HTTPError, h2.exceptions.ProtocolError) as exc:  # (h2's: see test_faults.py)
            return lines, exc
    return lines, None
