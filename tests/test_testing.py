"""``llmsim.testing.check_response_stream``: the test double passes it, and streams that
break one promise each do not (the backends run it in tests/protocol)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import pytest
import trio

from llmsim.api.http import Headers, ResponseState
from llmsim.testing import ReceivedResponse, StreamUnderTest, check_response_stream
from tests.api.fakes import FakeResponse


@attrs.define(eq=False)
class FakeStream:
    """A :class:`FakeResponse` whose client reads only when told to."""

    response: FakeResponse

    @property
    def high_water(self) -> int:
        return self.response.high_water

    @property
    def low_water(self) -> int:
        return self.response.low_water

    async def read(self) -> None:
        self.response.deliver()
        await trio.lowlevel.checkpoint()

    async def disconnect(self) -> None:
        self.response.disconnect()
        await trio.lowlevel.checkpoint()

    async def fail_handler(self) -> None:
        raise NotImplementedError("a test double runs no handler")

    def received(self) -> ReceivedResponse:
        response = self.response
        body = response.body
        return ReceivedResponse(
            response.status,
            tuple(response.headers.items()),
            body[: len(body) - response.unread],
            response.state is ResponseState.DONE,
        )


def fake_streams(kind: type[FakeResponse] = FakeResponse) -> Callable[[], AsyncIterator[StreamUnderTest]]:
    @asynccontextmanager
    async def open_stream() -> AsyncIterator[StreamUnderTest]:
        yield FakeStream(kind(reading=False, high_water=1000, low_water=100))

    return open_stream


async def test_the_fake_response_keeps_the_contract() -> None:
    await check_response_stream(fake_streams(), handler_failures=False)


# --- streams that break one promise each ---------------------------------------------------


class ClosedMeansEnded(FakeResponse):
    """What the test double used to say: closed once end() was called, never on a disconnect."""

    @property
    def closed(self) -> bool:
        return self.ended


class NoBackpressure(FakeResponse):
    def write(self, data: bytes) -> bool:
        super().write(data)
        return True


class DrainsTwice(FakeResponse):
    def on_drained(self, callback: Callable[[], None]) -> None:
        super().on_drained(callback)
        super().on_drained(callback)


class WritesAfterTheEnd(FakeResponse):
    def write(self, data: bytes) -> bool:
        return True if self.ended else super().write(data)


class ClosesAtTheEnd(FakeResponse):
    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        super().end(data, trailers)
        for callback in self._closed:
            callback()


@pytest.mark.parametrize(
    ("kind", "promise"),
    [
        (ClosedMeansEnded, "closed is True"),
        (NoBackpressure, "write\\(\\) returns False at the high-water mark"),
        (DrainsTwice, "on_drained runs"),
        (WritesAfterTheEnd, "write\\(\\) after end\\(\\) is refused"),
        (ClosesAtTheEnd, "on_close callbacks never run for a response that ended"),
    ],
)
async def test_a_broken_promise_fails_the_check(kind: type[FakeResponse], promise: str) -> None:
    with pytest.raises(AssertionError, match=f"ResponseStream contract: .*{promise}"):
        await check_response_stream(fake_streams(kind), handler_failures=False)
