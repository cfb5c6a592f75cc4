"""Helpers for test suites that embed a simulator (used by the pytest plugin too), and
:func:`check_response_stream`, the contract every ``ResponseStream`` backend passes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import attrs
import trio
import trio.testing

from llmsim.api.http import ResponseState, ResponseStateError, ResponseStream
from llmsim.config import Config
from llmsim.faults import parse_faults
from llmsim.server import ServerHandle, serve

__all__ = [
    "FAULT_HEADER",
    "ReceivedResponse",
    "StreamUnderTest",
    "check_response_stream",
    "fault_header",
    "fault_headers",
    "open_simulator",
]


@asynccontextmanager
async def open_simulator(config: Config | None = None, **overrides: Any) -> AsyncIterator[ServerHandle]:
    """Run a simulator on a free port for the duration of the ``async with`` block.

    ``overrides`` are settings as :class:`~llmsim.config.Config` takes them
    (``time_to_first_token=0.05``), applied over ``config``; ``port`` defaults to 0 so
    that tests never fight over a fixed port.
    """
    if config is None:
        config = Config(**{"port": 0, **overrides})
    elif overrides:
        config = config.replace(**overrides)
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(serve, config)
        try:
            yield handle
        finally:
            nursery.cancel_scope.cancel()


# --- protocol faults (docs/faults.md) ------------------------------------------------------

#: The request header that asks the native server for protocol faults.
FAULT_HEADER = "x-llmsim-fault"


def fault_header(
    *,
    rst_after: int | None = None,
    code: str | None = None,
    goaway_after: int | None = None,
    goaway_code: str | None = None,
    close_after: int | None = None,
    close_mode: str | None = None,
    frame_size: int | None = None,
    split_at: Sequence[int] = (),
    coalesce: int | None = None,
    empty_data: int | None = None,
    padding: int | None = None,
    continuation: int | None = None,
    delay_headers_ms: int | None = None,
    delay_first_token_ms: int | None = None,
    stall: tuple[int, int] | None = None,
    ping_after: int | None = None,
    settings_after: int | None = None,
    window_update_storm: tuple[int, int] | None = None,
    bad_event: tuple[int, str] | None = None,
    error_after: int | None = None,
    error_status: int | None = None,
    trailers: Mapping[str, str] | None = None,
) -> str:
    """The value of an ``x-llmsim-fault`` header asking for these faults (checked: a
    fault the server would refuse raises ``ValueError``)::

        fault_header(rst_after=5, code="CANCEL")      # "rst-after=5,code=CANCEL"
        fault_header(frame_size=3, stall=(2, 500))    # "frame-size=3; stall=2:500"

    ``code`` is the reset's RFC 9113 error code, ``close_mode`` ``"rst"`` or
    ``"close-notify"`` (default: a FIN), ``stall`` (after events, ms),
    ``window_update_storm`` (after events, count), ``bad_event`` (after events, kind).
    """
    faults = [
        _fault("rst-after", rst_after, code and f"code={code}"),
        _fault("goaway-after", goaway_after, goaway_code and f"code={goaway_code}"),
        _fault("close-after", close_after, close_mode and f"mode={close_mode}"),
        _fault("frame-size", frame_size),
        _fault("split-at", ",".join(map(str, split_at)) or None),
        _fault("coalesce", coalesce),
        _fault("empty-data", empty_data),
        _fault("padding", padding),
        _fault("continuation", continuation),
        _fault("delay-headers", delay_headers_ms),
        _fault("delay-first-token", delay_first_token_ms),
        _fault("stall", stall and f"{stall[0]}:{stall[1]}"),
        _fault("ping-after", ping_after),
        _fault("settings-after", settings_after),
        _fault("window-update-storm", window_update_storm and f"{window_update_storm[0]}:{window_update_storm[1]}"),
        _fault("bad-event", bad_event and f"{bad_event[0]}:{bad_event[1]}"),
        _fault("error-after", error_after, None if error_status is None else f"code={error_status}"),
        _fault("trailers", ",".join(f"{name}:{value}" for name, value in (trailers or {}).items()) or None),
    ]
    text = "; ".join(fault for fault in faults if fault)
    parse_faults(text)  # raises FaultSyntaxError, a ValueError, naming the bad fault
    return text


def fault_headers(**faults: Any) -> dict[str, str]:
    """``{"x-llmsim-fault": fault_header(**faults)}``: for ``httpx``'s ``headers=`` or the
    openai SDK's ``extra_headers=``."""
    return {FAULT_HEADER: fault_header(**faults)}


def _fault(name: str, value: object, option: str | None = None) -> str:
    if value is None:
        return ""
    return f"{name}={value}" + (f",{option}" if option else "")


# --- the ResponseStream contract --------------------------------------------------------


@attrs.frozen
class ReceivedResponse:
    """What the client of a :class:`StreamUnderTest` has received so far."""

    status: int | None  # None until the head arrived
    headers: tuple[tuple[bytes, bytes], ...] = ()  # names lower-case
    body: bytes = b""
    complete: bool = False  # the response arrived to its end (not cut by a reset, a close or an error)
    trailers: tuple[tuple[bytes, bytes], ...] = ()  # the fields after the body (names lower-case)


class StreamUnderTest(Protocol):
    """One fresh response of the backend under test, with the client end of it.

    The client reads only when told to (:meth:`read`), so that bytes can pile up in the
    response's buffer; the handler that owns :attr:`response` waits, doing nothing,
    until the checker has finished with it (or :meth:`fail_handler`).
    """

    @property
    def response(self) -> ResponseStream:
        """The response, not started yet."""

    @property
    def high_water(self) -> int:
        """The response's high-water mark (``write`` returns False from here on)."""

    @property
    def low_water(self) -> int:
        """The response's low-water mark (``on_drained`` callbacks run below it)."""

    async def read(self) -> None:
        """The client reads everything the server sends until nothing more moves."""

    async def disconnect(self) -> None:
        """The client goes away (EOF, RST_STREAM, ``http.disconnect``); returns once the
        server side has seen it."""

    async def fail_handler(self) -> None:
        """The handler that owns :attr:`response` raises an exception now; returns once
        the server has dealt with it.  (Only called with ``handler_failures``.)"""

    def received(self) -> ReceivedResponse:
        """What the client has read so far."""


OpenStream = Callable[[], AbstractAsyncContextManager[StreamUnderTest]]
_HEAD = ((b"content-type", b"text/plain"), (b"x-contract", b"1"))


async def check_response_stream(
    open_stream: OpenStream, *, handler_failures: bool = True, trailers: bool = False
) -> None:
    """Check a :class:`~llmsim.api.http.ResponseStream` implementation against what
    :mod:`llmsim.api.http` promises, in the spirit of ``trio.testing.check_one_way_stream``.

    ``open_stream()`` is an async context manager giving a fresh :class:`StreamUnderTest`
    (each check opens its own).  The checks: the order of ``start``/``write``/``end``
    and the :class:`~llmsim.api.http.ResponseStateError` out of order; what ``closed``
    means after the end, after the client went away (before the start, mid-body,
    after the end) and what the calls do then; backpressure (``write`` returns False
    at the high-water mark, ``on_drained`` runs once the client read the buffer);
    and, with ``handler_failures`` (off for a test double that runs no handler), that a
    handler failing before ``start`` is answered 500 in the error envelope and one
    failing after it has its response aborted.  With ``trailers`` (a backend that
    carries them: HTTP/2, chunked HTTP/1.1), that ``end(data, trailers)`` delivers the
    body and then the trailer fields.  Raises AssertionError on the first
    broken promise.  Needs a running trio loop (it uses
    ``trio.testing.wait_all_tasks_blocked``).
    """
    checks: list[Callable[[StreamUnderTest], Awaitable[None]]] = [
        _check_call_order,
        _check_disconnect_before_start,
        _check_disconnect_mid_body,
        _check_disconnect_after_end,
        _check_backpressure,
    ]
    if handler_failures:
        checks += [_check_failure_before_start, _check_failure_after_start]
    if trailers:
        checks.append(_check_trailers)
    for check in checks:
        async with open_stream() as peer:
            await check(peer)


def _expect(condition: bool, promise: str) -> None:
    if not condition:
        raise AssertionError(f"ResponseStream contract: {promise}")


def _expect_refused(call: Callable[[], object], promise: str) -> None:
    try:
        call()
    except ResponseStateError:
        return
    raise AssertionError(f"ResponseStream contract: {promise} (no ResponseStateError)")


class _Calls:
    """Counts the calls of a callback."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _expect_state(response: ResponseStream, state: ResponseState, when: str) -> None:
    _expect(response.state is state, f"{when}, the state is {state.name}, not {response.state.name}")
    _expect(response.started == state.started, f"{when}, started is {state.started}")
    _expect(response.ended == state.ended, f"{when}, ended is {state.ended}")
    _expect(response.closed == state.closed, f"{when}, closed is {state.closed}")


async def _check_call_order(peer: StreamUnderTest) -> None:
    response = peer.response
    _expect_state(response, ResponseState.IDLE, "before start()")
    never = _Calls()
    response.on_close(never)
    _expect_refused(lambda: response.write(b"x"), "write() before start() is refused")
    _expect_refused(lambda: response.end(b"x"), "end() before start() is refused")
    response.start(200, _HEAD)
    _expect_state(response, ResponseState.STREAMING, "after start()")
    _expect_refused(lambda: response.start(200, _HEAD), "a second start() is refused")
    _expect(response.write(b"ab") is True, "a small write() below the high-water mark returns True")
    await peer.read()
    _expect(not response.closed, "closed stays False while the body is open, whatever the client read")
    response.end(b"c")
    _expect(response.ended and response.started, "after end(), started and ended are True")
    _expect_refused(lambda: response.write(b"x"), "write() after end() is refused")
    _expect_refused(lambda: response.end(), "a second end() is refused")
    _expect_refused(lambda: response.start(200, _HEAD), "start() after end() is refused")
    await peer.read()
    _expect_state(response, ResponseState.DONE, "once the client read the whole response")
    received = peer.received()
    _expect(received.status == 200, f"the client got the status (got {received.status})")
    _expect((b"x-contract", b"1") in received.headers, "the client got the headers")
    _expect(received.body == b"abc", f"the client got every byte written, in order (got {received.body[:40]!r})")
    _expect(received.complete, "the client saw the response complete")
    late = _Calls()
    response.on_close(late)
    drained = _Calls()
    response.on_drained(drained)
    _expect(never.count == late.count == 0, "on_close callbacks never run for a response that ended")
    _expect(drained.count == 1, "on_drained runs at once on a closed response")


async def _leave(peer: StreamUnderTest, state: ResponseState, when: str) -> _Calls:
    """The client leaves: the response is in ``state``, an ``on_close`` callback registered
    before runs once, one registered after runs at once.  Returns the first one's counter."""
    response = peer.response
    early = _Calls()
    response.on_close(early)
    await peer.disconnect()
    _expect_state(response, state, when)
    _expect(early.count == 1, f"on_close callbacks run once when the client leaves (ran {early.count} times)")
    late = _Calls()
    response.on_close(late)
    _expect(late.count == 1, "on_close runs at once once the client has left before the end")
    return early


async def _check_disconnect_before_start(peer: StreamUnderTest) -> None:
    response = peer.response
    early = await _leave(peer, ResponseState.CLOSED_IDLE, "after the client left before start()")
    response.start(200, _HEAD)
    _expect_state(response, ResponseState.CLOSED_STREAMING, "after start() on a closed response")
    _expect(response.write(b"dropped") is True, "write() after the client left returns True")
    _expect_refused(lambda: response.start(200, _HEAD), "a second start() is refused, the client gone or not")
    response.end(b"dropped")
    _expect_state(response, ResponseState.CLOSED_ENDED, "after end() on a closed response")
    _expect(early.count == 1, "on_close callbacks run only once")


async def _check_disconnect_mid_body(peer: StreamUnderTest) -> None:
    response = peer.response
    response.start(200, _HEAD)
    response.write(b"first")
    await peer.read()
    early = await _leave(peer, ResponseState.CLOSED_STREAMING, "after the client left mid-body")
    _expect(response.write(b"x" * peer.high_water) is True, "write() after the client left returns True")
    drained = _Calls()
    response.on_drained(drained)
    _expect(drained.count == 1, "on_drained runs at once once the client has left")
    response.end(b"last")
    _expect_state(response, ResponseState.CLOSED_ENDED, "after end() on a closed response")
    _expect(early.count == 1, "on_close callbacks run only once")
    _expect(not peer.received().complete, "a response cut by the client is not complete")


async def _check_disconnect_after_end(peer: StreamUnderTest) -> None:
    response = peer.response
    never = _Calls()
    response.on_close(never)
    response.start(200, _HEAD)
    response.end(b"done")
    await peer.read()
    await peer.disconnect()
    _expect_state(response, ResponseState.DONE, "after the client left a complete response")
    _expect(never.count == 0, "on_close callbacks never run for a response that ended")
    _expect(peer.received().complete, "the client saw the response complete")


async def _check_backpressure(peer: StreamUnderTest) -> None:
    response = peer.response
    response.start(200, _HEAD)
    await peer.read()
    at_once = _Calls()
    response.on_drained(at_once)
    _expect(at_once.count == 1, "on_drained runs at once when the buffer is below its low-water mark")
    _expect(response.write(b"x" * peer.high_water) is False, "write() returns False at the high-water mark")
    drained = _Calls()
    response.on_drained(drained)
    await trio.testing.wait_all_tasks_blocked()
    _expect(drained.count == 0, "on_drained waits while the client reads nothing")
    await peer.read()
    _expect(drained.count == 1, f"on_drained runs once after the client read the buffer (ran {drained.count} times)")
    _expect(response.write(b"y") is True, "write() returns True again once the buffer drained")
    response.end(b"z")
    await peer.read()
    received = peer.received()
    _expect(received.body == b"x" * peer.high_water + b"yz", "every byte written arrives, in order")
    _expect(received.complete and response.state is ResponseState.DONE, "the response completes")
    _expect(drained.count == 1, "on_drained callbacks run only once")


async def _check_trailers(peer: StreamUnderTest) -> None:
    response = peer.response
    response.start(200, _HEAD)
    response.write(b"body")
    response.end(b"", trailers=((b"x-trailer", b"t1"), (b"x-status", b"0")))
    await peer.read()
    _expect_state(response, ResponseState.DONE, "once the client read a response ended with trailers")
    received = peer.received()
    _expect(received.body == b"body" and received.complete, "the body before the trailers arrives complete")
    _expect(
        received.trailers == ((b"x-trailer", b"t1"), (b"x-status", b"0")),
        f"the trailers given to end() arrive after the body, in order (got {received.trailers!r})",
    )


async def _check_failure_before_start(peer: StreamUnderTest) -> None:
    response = peer.response
    await peer.fail_handler()
    await peer.read()
    received = peer.received()
    _expect(received.status == 500, f"a handler failing before start() is answered 500 (got {received.status})")
    try:
        error = json.loads(received.body)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(
            f"ResponseStream contract: the 500 is the error envelope (got {received.body[:80]!r})"
        ) from None
    _expect(error.get("code") == 500 and error.get("type") == "InternalServerError", "the 500 envelope names it")
    _expect(received.complete, "the 500 is a complete response")
    _expect_state(response, ResponseState.DONE, "once the 500 was read")


async def _check_failure_after_start(peer: StreamUnderTest) -> None:
    response = peer.response
    response.start(200, _HEAD)
    response.write(b"partial")
    await peer.read()
    await peer.fail_handler()
    await peer.read()
    _expect(response.closed and not response.ended, "a handler failing after start() has its response closed")
    received = peer.received()
    _expect(received.status == 200 and not received.complete, "the client never sees that response complete")
