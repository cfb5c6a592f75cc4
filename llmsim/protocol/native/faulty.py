"""Applying an ``x-llmsim-fault`` plan (:mod:`llmsim.protocol.faults`) to one response.

A request without the header never comes here (:func:`~.stream.run_handler` looks the
header up once).  With it, the handler writes to a :class:`FaultyResponse` instead of
its :class:`~.stream.OutboundStream`: the handler's calls only queue, and a pump task
beside the handler forwards them one at a time, waiting after each body event until
the connection has put it on the wire.  So every event leaves in its own DATA frames
(or chunk), the frames are the same on every run, and a fault lands exactly after
event N.  The faults themselves go through the host (the HTTP/1.1 or HTTP/2 handler):
``inject_reset`` is the same path a client's RST_STREAM takes (the stream is dropped,
the handler cancelled, its close callbacks run, the engine frees the slot at once).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

import attrs
import trio

from llmsim.api.http import Application, Headers, HttpRequest, ResponseEvent, ResponseState, next_state
from llmsim.protocol.faults import FaultPlan, FaultSyntaxError, parse_faults
from llmsim.protocol.native.handling import fail_if_unended, handle_or_fail

if TYPE_CHECKING:
    from collections.abc import Callable

    from llmsim.protocol.native.stream import OutboundStream

__all__ = ["FaultyResponse", "run_with_faults"]

log = logging.getLogger("llmsim.protocol")

_IDLE, _STREAMING, _ENDED, _DONE = ResponseState.IDLE, ResponseState.STREAMING, ResponseState.ENDED, ResponseState.DONE
_START, _WRITE, _END, _CLOSE = ResponseEvent.START, ResponseEvent.WRITE, ResponseEvent.END, ResponseEvent.CLOSE
# The pump's operations: ("start", (status, headers)), ("write", data), ("end", None), ("fail", message).
_Op = tuple[str, object]


async def run_with_faults(app: Application, request: HttpRequest, stream: OutboundStream, header: bytes) -> None:
    """:func:`~.stream.run_handler` for a request with an ``x-llmsim-fault`` header: a
    malformed header is a 400 naming the bad fault; otherwise the handler runs on a
    :class:`FaultyResponse` with its pump beside it, both in the stream's cancel scope."""
    try:
        plan = parse_faults(header.decode("latin-1"))
    except FaultSyntaxError as exc:
        stream.respond_error(400, str(exc))
        return
    log.debug("x-llmsim-fault for %s %s: %s", request.method, request.path, plan)
    response = FaultyResponse(stream, plan)
    with stream.cancel_scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(response.pump)
            if await handle_or_fail(app, request, response):
                fail_if_unended(request, response)


@attrs.define(eq=False, repr=False)
class FaultyResponse:
    """The :class:`~llmsim.api.http.ResponseStream` a faulted request's handler writes to.

    Its own state follows the handler's calls; once the real stream is closed (reset,
    connection lost, or a fault fired) it reads as closed too, so the handler sees a
    client that went away.
    """

    stream: OutboundStream
    plan: FaultPlan
    _state: ResponseState = attrs.field(default=_IDLE, init=False)
    _ops: deque[_Op] = attrs.field(factory=deque, init=False)
    _queued: int = attrs.field(default=0, init=False)  # body bytes in _ops
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)

    # --- ResponseStream: the handler's side -----------------------------------------------
    @property
    def state(self) -> ResponseState:
        real = self.stream.state
        if real.closed and real is not _DONE:
            return next_state(self._state, _CLOSE)
        return self._state

    @property
    def closed(self) -> bool:
        return self.state.closed

    @property
    def started(self) -> bool:
        return self._state.started

    @property
    def ended(self) -> bool:
        return self._state.ended

    def start(self, status: int, headers: Headers) -> None:
        self._state = next_state(self._state, _START)
        self._push(("start", (status, tuple(headers))))

    def write(self, data: bytes) -> bool:
        self._state = next_state(self._state, _WRITE)
        if data and not self.closed:
            self._queued += len(data)
            self._push(("write", data))
        return self._queued + self.stream.buffered < self.stream.high_water

    def end(self, data: bytes = b"") -> None:
        self._state = next_state(self._state, _END)
        if data:
            self._queued += len(data)
            self._push(("write", data))
        self._push(("end", None))

    def on_drained(self, callback: Callable[[], None]) -> None:
        self.stream.on_drained(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        self.stream.on_close(callback)

    def fail(self, message: str) -> None:
        """The handler failed: the pump answers a 500 or aborts, once it gets there."""
        self._push(("fail", message))

    def _push(self, op: _Op) -> None:
        self._ops.append(op)
        self._wake.set()

    # --- the pump ---------------------------------------------------------------------------
    async def pump(self) -> None:
        """Forward the handler's calls to the stream, applying the plan; returns after
        the end, a failure, or a fault that ends the stream."""
        try:
            await self._pump()
        except Exception:  # a bug here must not take the connection down
            log.exception("applying x-llmsim-fault failed")
            self.stream.fail("the server failed while injecting a fault; see the server log")

    async def _pump(self) -> None:
        events = 0
        while True:
            kind, arg = await self._next()
            if kind == "start":
                assert isinstance(arg, tuple)
                await self._start(*arg)
                if not await self._after_event(0):
                    return
            elif kind == "write":
                assert isinstance(arg, bytes)
                self._queued -= len(arg)
                await self._send_event(arg)
                events += 1
                if not await self._after_event(events):
                    return
            elif kind == "end":
                if self.plan.trailers and not self.stream.state.closed:
                    self.stream.host.send_trailers(self.stream, self.plan.trailers)
                else:
                    self.stream.end()
                return
            else:
                assert isinstance(arg, str)
                self.stream.fail(arg)
                return

    async def _next(self) -> _Op:
        while not self._ops:
            await self._wake.wait()
            self._wake = trio.Event()
        return self._ops.popleft()

    async def _start(self, status: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        plan, stream = self.plan, self.stream
        if plan.delay_headers_ms:
            await trio.sleep(plan.delay_headers_ms / 1000)
        if plan.trailers:  # trailers need a body of unknown length (HTTP/1.1: chunked)
            headers = tuple((name, value) for name, value in headers if name.lower() != b"content-length")
        if plan.goaway_after is not None and not stream.host.multiplexed:
            stream.host.inject_goaway(stream)  # HTTP/1.1: "Connection: close" in this head
        stream.start(status, headers)

    async def _send_event(self, data: bytes) -> None:
        """Write ``data`` (in pieces of ``frame_size`` bytes) and wait until each piece is on the wire."""
        size = self.plan.frame_size or len(data)
        for offset in range(0, len(data), size):
            self.stream.write(data[offset : offset + size])
            await self._taken()

    async def _after_event(self, events: int) -> bool:
        """The faults due after event ``events``; False once the stream is gone."""
        plan, stream = self.plan, self.stream
        if events in (plan.stall_after, plan.goaway_after, plan.rst_after, plan.close_after):
            await self._taken()  # (after event 0, the head)
        if events == plan.stall_after:
            await trio.sleep(plan.stall_ms / 1000)
        if events == plan.goaway_after and stream.host.multiplexed:
            stream.host.inject_goaway(stream)
        if events == plan.rst_after:
            stream.host.inject_reset(stream, plan.rst_code)
            return False
        if events == plan.close_after:
            stream.host.inject_close(stream)
            return False
        return not stream.state.closed

    async def _taken(self) -> None:
        """Wait until the head and every byte written are on the wire (the host calls
        ``stream.flushed()`` after each batch that carried some of them)."""
        stream = self.stream
        while (stream.head_pending or stream.buffered) and not stream.state.closed:
            sent = trio.Event()
            stream.drained_callbacks.append(sent.set)
            await sent.wait()
