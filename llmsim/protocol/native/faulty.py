"""Applying an ``x-llmsim-fault`` plan (:mod:`llmsim.faults`) to one response.

A request without the header (and not picked by ``--fault-rate``) never comes here
(:func:`~.stream.start_handler` looks the header up once).  With it, the handler writes to
a :class:`FaultyResponse` instead of its :class:`~.stream.OutboundStream`: the handler's
calls only queue, and a pump task beside the handler forwards them one at a time,
waiting after each body event until the connection has taken it.  So every event leaves
in its own DATA frames (or chunk), the frames are the same on every run, and a fault
lands exactly after event N.  The faults themselves go through the host (the HTTP/1.1
or HTTP/2 handler): ``inject_reset`` is the same path a client's RST_STREAM takes (the
stream is dropped, the handler cancelled, its close callbacks run, the engine frees the
slot at once).  Each fault, when it first acts on a response, is counted
(:class:`~llmsim.api.http.InjectedFaults`, ``llmsim:injected_faults_total`` on
``/metrics``) and logged.
"""

from __future__ import annotations

import json
import logging
import random
from collections import deque
from typing import TYPE_CHECKING

import attrs
import trio

from llmsim.api.http import (
    Application,
    Headers,
    HttpRequest,
    InjectedFaults,
    ResponseEvent,
    ResponseState,
    next_state,
    openai_error_type,
)
from llmsim.faults import FaultPlan, FaultSyntaxError, parse_faults
from llmsim.protocol.native.handling import fail_if_unended, handle_or_fail

if TYPE_CHECKING:
    from collections.abc import Callable

    from llmsim.protocol.native.stream import OutboundStream

__all__ = ["FaultInjection", "FaultyResponse", "run_with_faults", "vllm_error_event"]

log = logging.getLogger("llmsim.protocol")

_IDLE, _STREAMING, _ENDED, _DONE = ResponseState.IDLE, ResponseState.STREAMING, ResponseState.ENDED, ResponseState.DONE
_START, _WRITE, _END, _CLOSE = ResponseEvent.START, ResponseEvent.WRITE, ResponseEvent.END, ResponseEvent.CLOSE
# The pump's operations: ("start", (status, headers)), ("write", data), ("end", trailers), ("fail", message).
_Op = tuple[str, object]
#: ``bad-event`` kinds that add an event (the others change the next one).
_EXTRA_EVENTS = {
    "bad-json": b'data: {"id": "cmpl-llmsim", "choices": [{"index": 0, "text": \n\n',
    "bare-data": b"data:\n\n",
}
#: The messages of vLLM's ``GenerationError`` and ``RetryableRequestError`` (vllm/exceptions.py:131-144).
_ERROR_MESSAGES = {500: "Internal server error", 503: "Request failed; please retry"}


@attrs.define(eq=False)
class FaultInjection:
    """The server's fault injection: the faults ``--fault`` gives a share (``--fault-rate``)
    of the ``/v1/`` requests without a header of their own, read live (``/admin/config``
    may change them), and the count of every fault injected.  The share is rolled with
    its own random stream, reproducible under ``--seed``."""

    counts: InjectedFaults
    control: Callable[[], tuple[str | None, float]]  # the live (--fault, --fault-rate)
    seed: int | None = None
    _rng: random.Random = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(None if self.seed is None else f"faults:{self.seed}")

    def global_faults(self, request: HttpRequest) -> bytes | None:
        """``--fault`` for this request if the roll picks it, else None."""
        faults, rate = self.control()
        if not faults or rate <= 0 or not request.path.startswith("/v1/"):
            return None
        return faults.encode("latin-1") if self._rng.random() < rate else None


def vllm_error_event(status: int) -> bytes:
    """The event vLLM sends when generation fails mid-stream, then ``[DONE]``:
    ``create_streaming_error_response`` (``json.dumps`` of the error envelope,
    vllm/entrypoints/generate/base/serving.py:183-197, 209-213; the type and code of a
    ``GenerationError``, vllm/entrypoints/serve/exception_handling/error_response.py:60-66)
    written by the stream generators (vllm/entrypoints/openai/completion/serving.py:553-560,
    chat_completion/serving.py:503-507)."""
    error_type = "ServiceUnavailableError" if status == 503 else openai_error_type(status)
    message = _ERROR_MESSAGES.get(status, f"injected error ({status})")
    envelope = {"error": {"message": message, "type": error_type, "param": None, "code": status}}
    return f"data: {json.dumps(envelope)}\n\ndata: [DONE]\n\n".encode()


async def run_with_faults(
    app: Application, request: HttpRequest, stream: OutboundStream, header: bytes, faults: FaultInjection | None
) -> None:
    """:func:`~.stream.run_handler` for a request with faults (:func:`~.stream.start_handler`
    spawns it): a malformed header is a 400 naming the bad fault; otherwise the handler
    runs on a :class:`FaultyResponse` with its pump beside it, both in the stream's
    cancel scope.  A request whose stream was reset before this ran is not answered."""
    if stream.state.closed:
        return
    try:
        plan = parse_faults(header.decode("latin-1"))
    except FaultSyntaxError as exc:
        stream.respond_error(400, str(exc))
        return
    log.debug("x-llmsim-fault for %s %s: %s", request.method, request.path, plan)
    stream.frame_at_once = False  # the pump sends each piece in a batch of its own (_taken)
    response = FaultyResponse(stream, plan, request, faults)
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
    request: HttpRequest | None = None
    faults: FaultInjection | None = None
    _state: ResponseState = attrs.field(default=_IDLE, init=False)
    _ops: deque[_Op] = attrs.field(factory=deque, init=False)
    _queued: int = attrs.field(default=0, init=False)  # body bytes in _ops
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _gone: bool = attrs.field(default=False, init=False)  # an error event ended the real stream
    _close_callbacks: list[Callable[[], None]] = attrs.field(factory=list, init=False)
    _held: bytes = attrs.field(default=b"", init=False)  # events coalesced, not sent yet
    _sent_any: bool = attrs.field(default=False, init=False)
    _fired: set[str] = attrs.field(factory=set, init=False)
    _due: frozenset[int] = attrs.field(init=False)  # events after which a fault acts
    _malformed_event: int = attrs.field(init=False)  # the event bad-event crlf / event-line changes (0: none)

    def __attrs_post_init__(self) -> None:
        plan = self.plan
        due = (plan.stall_after, plan.goaway_after, plan.rst_after, plan.close_after, plan.ping_after)
        more = (plan.settings_after, plan.storm_after, plan.bad_event_after, plan.error_after)
        self._due = frozenset(n for n in (*due, *more) if n is not None)
        after = plan.bad_event_after
        self._malformed_event = after + 1 if after is not None and plan.bad_event_kind not in _EXTRA_EVENTS else 0

    # --- ResponseStream: the handler's side -----------------------------------------------
    @property
    def state(self) -> ResponseState:
        real = self.stream.state
        if self._gone or (real.closed and real is not _DONE):
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

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        self._state = next_state(self._state, _END)
        if data:
            self._queued += len(data)
            self._push(("write", data))
        self._push(("end", tuple(trailers)))

    def on_drained(self, callback: Callable[[], None]) -> None:
        self.stream.on_drained(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        if self._gone:
            callback()
            return
        self._close_callbacks.append(callback)
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
                events += 1
                if events == self._malformed_event:
                    arg = self._malformed(arg)
                if not self._hold(events, arg) and not await self._event(events, arg):
                    return
            elif kind == "end":
                assert isinstance(arg, tuple)
                await self._end(arg)
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

    def _fire(self, name: str, detail: str = "") -> None:
        """Fault ``name`` acts on this response (counted and logged once per response)."""
        if name in self._fired:
            return
        self._fired.add(name)
        if self.faults is not None:
            self.faults.counts.add(name)
        request, stream = self.request, self.stream
        where = f"{request.method} {request.path}" if request is not None else "a response"
        on = f"HTTP/2 stream {stream.stream_id}" if stream.host.multiplexed else "HTTP/1.1"
        log.info("injected fault %s on %s (%s)%s", name, where, on, f": {detail}" if detail else "")

    async def _start(self, status: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        plan, stream = self.plan, self.stream
        if plan.delay_headers_ms:
            self._fire("delay-headers", f"{plan.delay_headers_ms} ms")
            await trio.sleep(plan.delay_headers_ms / 1000)
        if plan.trailers:  # trailers need a body of unknown length (HTTP/1.1: chunked)
            headers = tuple((name, value) for name, value in headers if name.lower() != b"content-length")
        if plan.goaway_after is not None and plan.goaway_code is None and not stream.host.multiplexed:
            self._fire("goaway-after", "Connection: close")
            stream.host.inject_goaway(stream, None)  # HTTP/1.1: "Connection: close" in this head
        stream.start(status, headers)
        if plan.continuation is not None and stream.host.inject_head_frames(stream, plan.continuation):
            self._fire("continuation", f"header block in frames of {plan.continuation} bytes")

    def _hold(self, events: int, data: bytes) -> bool:
        """``coalesce=K``: keep event ``events`` to send with the next (True), unless it
        completes a group of K or a fault acts after it."""
        k = self.plan.coalesce
        if k is None or events % k == 0 or events in self._due:
            return False
        self._fire("coalesce", f"{k} events per frame")
        self._held += data
        return True

    async def _event(self, events: int, data: bytes) -> bool:
        """Send event ``events`` (with any held before it), then the faults due after it."""
        plan = self.plan
        data, self._held = self._held + data, b""
        if not self._sent_any and plan.first_token_delay_ms:
            await self._taken()
            self._fire("delay-first-token", f"{plan.first_token_delay_ms} ms")
            await trio.sleep(plan.first_token_delay_ms / 1000)
        self._sent_any = True
        await self._send_event(data)
        return await self._after_event(events)

    def _malformed(self, data: bytes) -> bytes:
        kind = self.plan.bad_event_kind
        if kind == "crlf":
            self._fire("bad-event", "CRLF line endings")
            return data.replace(b"\n", b"\r\n")
        if kind == "event-line":
            self._fire("bad-event", "an event: line")
            return b"event: message\n" + data
        return data

    async def _end(self, trailers: tuple[tuple[bytes, bytes], ...]) -> None:
        """The end, with the handler's trailers (and the plan's after them)."""
        if self._held:
            await self._send_event(self._held)
        if self.plan.trailers and not self.stream.state.closed:
            self._fire("trailers")
            self.stream.host.send_trailers(self.stream, (*trailers, *self.plan.trailers))
        else:
            self.stream.end(trailers=trailers)

    async def _send_event(self, data: bytes) -> None:
        """Write ``data`` in the pieces the plan asks for, each taken before the next."""
        plan, stream = self.plan, self.stream
        if plan.empty_data:
            await self._taken()
            if stream.host.inject_frames(stream, "empty-data", plan.empty_data):
                self._fire("empty-data", f"{plan.empty_data} before each event")
        for piece in self._pieces(data):
            if plan.padding is not None:
                await self._taken()
                if stream.host.write_padded(stream, piece, plan.padding):
                    self._fire("padding", f"{plan.padding} bytes per DATA frame")
                    continue
            stream.write(piece)
            await self._taken()

    def _pieces(self, data: bytes) -> list[bytes]:
        """``data`` cut at the ``split-at`` offsets, then into ``frame-size`` pieces."""
        plan = self.plan
        cuts = [offset for offset in plan.split_at if offset < len(data)]
        if cuts:
            self._fire("split-at", ",".join(map(str, cuts)))
        parts = [data[start:stop] for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        size = plan.frame_size
        if size is None or all(len(part) <= size for part in parts):
            return parts
        self._fire("frame-size", f"{size} bytes")
        return [part[offset : offset + size] for part in parts for offset in range(0, len(part), size)]

    async def _after_event(self, events: int) -> bool:
        """The faults due after event ``events``; False once the stream is gone."""
        plan, stream = self.plan, self.stream
        if events not in self._due:
            return not stream.state.closed
        await self._taken()  # (after event 0, the head)
        if events == plan.stall_after:
            self._fire("stall", f"{plan.stall_ms} ms after event {events}")
            await trio.sleep(plan.stall_ms / 1000)
        if events == plan.bad_event_after and plan.bad_event_kind in _EXTRA_EVENTS:
            self._fire("bad-event", plan.bad_event_kind)
            await self._send_event(_EXTRA_EVENTS[plan.bad_event_kind])
        self._frames(events)
        if events == plan.goaway_after and (stream.host.multiplexed or plan.goaway_code is not None):
            self._fire("goaway-after", f"after event {events}")
            stream.host.inject_goaway(stream, plan.goaway_code)
        if events == plan.error_after:
            await self._error_event()
            return False
        if events == plan.rst_after:
            self._fire("rst-after", f"after event {events}")
            stream.host.inject_reset(stream, plan.rst_code)
            return False
        if events == plan.close_after:
            self._fire("close-after", f"{plan.close_mode} after event {events}")
            stream.host.inject_close(stream, plan.close_mode)
            return False
        return not stream.state.closed

    def _frames(self, events: int) -> None:
        """The HTTP/2 control frames due after event ``events`` (nothing on HTTP/1.1)."""
        plan, stream, host = self.plan, self.stream, self.stream.host
        if events == plan.ping_after and host.inject_frames(stream, "ping", 1):
            self._fire("ping-after", f"after event {events}")
        if events == plan.settings_after and host.inject_frames(stream, "settings", 1):
            self._fire("settings-after", f"after event {events}")
        if events == plan.storm_after and host.inject_frames(stream, "window-updates", plan.storm_count):
            self._fire("window-update-storm", f"{plan.storm_count} WINDOW_UPDATE frames after event {events}")

    async def _error_event(self) -> None:
        """vLLM's mid-stream error event and ``[DONE]`` end the response; the handler then
        sees a client that went away (its close callbacks run, it is cancelled: the
        engine frees the request's slot)."""
        status = self.plan.error_status
        self._fire("error-after", f"a {status} error event")
        stream = self.stream
        if stream.state.closed:
            return
        await self._send_event(vllm_error_event(status))
        stream.end()
        self._gone = True
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            callback()
        stream.cancel_scope.cancel()

    async def _taken(self) -> None:
        """Wait until the head and every byte written are on the wire (the host calls
        ``stream.flushed()`` after each batch that carried some of them)."""
        stream = self.stream
        while (stream.head_pending or stream.buffered) and not stream.state.closed:
            sent = trio.Event()
            stream.drained_callbacks.append(sent.set)
            await sent.wait()
