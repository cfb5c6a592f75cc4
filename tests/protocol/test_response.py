"""BufferedResponse, the part of a response stream both backends share: the exact water
marks, the buffer's order, and what each end of its life does (the contract over real
connections is in test_response_contract.py)."""

from __future__ import annotations

import attrs
import pytest

from llmsim._version import __version__
from llmsim.api.http import ResponseState, ResponseStateError
from llmsim.protocol.response import BufferedResponse


@attrs.define(eq=False)
class Host:
    scheduled: int = 0

    def schedule(self, stream: BufferedResponse) -> None:
        stream.queued = True
        self.scheduled += 1


def response(high_water: int = 10, low_water: int = 4) -> tuple[BufferedResponse, Host]:
    host = Host()
    return BufferedResponse(host=host, high_water=high_water, low_water=low_water), host


def test_write_returns_false_from_the_high_water_mark_on() -> None:
    stream, _ = response()
    stream.start(200, ())
    assert stream.write(b"123456789")  # 9 < 10
    assert not stream.write(b"0")  # 10
    assert stream.take(3) == b"123"
    assert stream.write(b"")  # 7
    assert stream.take(100) == b"4567890" and stream.buffered == 0


def test_on_drained_waits_until_the_buffer_is_below_the_low_water_mark() -> None:
    stream, _ = response()
    stream.start(200, ())
    stream.write(b"x" * 12)
    calls: list[str] = []
    stream.on_drained(lambda: calls.append("drained"))
    stream.take(8)  # 4 left: at the mark, not below
    stream.flushed()
    assert calls == []
    stream.take(1)
    stream.flushed()
    stream.flushed()
    assert calls == ["drained"]


def test_the_host_is_scheduled_once_until_it_takes_the_bytes() -> None:
    stream, host = response()
    stream.start(200, ())
    assert host.scheduled == 1
    stream.write(b"a")
    stream.write(b"b")
    assert host.scheduled == 1  # queued: the host has not run yet
    stream.queued = False
    stream.write(b"c")
    stream.end(b"d")
    assert host.scheduled == 3 and stream.take(10) == b"abcd"


def test_a_head_only_response_buffers_no_body() -> None:
    stream = BufferedResponse(host=Host(), head_only=True)
    stream.start(200, ((b"content-length", b"5"),))
    assert stream.write(b"hello")
    stream.end(b"!")
    assert stream.buffered == 0 and stream.state is ResponseState.ENDED


async def test_finish_completes_only_an_ended_response() -> None:
    stream, _ = response()
    stream.start(200, ())
    with pytest.raises(ResponseStateError, match="cannot complete in state STREAMING"):
        stream.finish()
    stream.end()
    stream.finish()
    assert stream.state is ResponseState.DONE
    stream.abort()  # a late disconnect changes nothing
    assert stream.state is ResponseState.DONE and not stream.cancel_scope.cancel_called


def test_abort_drops_the_buffer_cancels_the_handler_and_runs_the_close_callbacks_once() -> None:
    stream, _ = response()
    calls: list[str] = []
    stream.on_close(lambda: calls.append("closed"))
    stream.start(200, ())
    stream.write(b"x" * 20)
    stream.on_drained(lambda: calls.append("drained"))
    stream.abort()
    stream.abort()
    assert calls == ["closed"]
    assert stream.buffered == 0 and stream.chunks == [] and stream.cancel_scope.cancel_called
    assert stream.state is ResponseState.CLOSED_STREAMING


def test_respond_error_is_a_complete_response_in_the_envelope() -> None:
    stream, _ = response(high_water=1000)
    stream.respond_error(413, "too big", ((b"connection", b"close"),))
    body = stream.take(1000)
    assert stream.status == 413 and stream.state is ResponseState.ENDED
    assert stream.headers == (
        (b"content-type", b"application/json"),
        (b"x-llmsim-version", __version__.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    )
    assert body == b'{"error":{"message":"too big","type":"RequestEntityTooLarge","param":null,"code":413}}'


async def test_the_cancel_scope_is_made_when_asked_for_and_comes_cancelled_after_an_abort() -> None:
    """(A handler of an application that ends on its own runs in none: see stream.run_handler.)"""
    stream, _ = response()
    stream.start(200, ())
    stream.abort()
    assert stream.cancel_scope.cancel_called  # made now, after the client went away
    done, _ = response()
    done.start(200, ())
    done.end()
    done.finish()
    assert not done.cancel_scope.cancel_called  # complete: nothing to cancel
