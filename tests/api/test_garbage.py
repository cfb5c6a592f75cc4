"""A finished request leaves nothing for the cycle collector.

Jobs point at their sink; a sink (or a renderer) that kept pointing back at its jobs
made a reference cycle of every streaming request's objects, response stream included,
and the cycle collector's passes over them cost about a fifth of a streaming request's
CPU.  With the cycle collector off, the response must be freed as soon as nobody holds it.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from trio.testing import MockClock

from tests.api.fakes import FakeResponse, post, running

HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"messages": HELLO, "stream": True, "max_tokens": 3, "n": 2, "stream_options": {"include_usage": True}},
        ),
        ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 3}),
        ("/v1/completions", {"prompt": "Hi", "stream": True, "max_tokens": 3}),
        ("/v1/responses", {"input": "Hi", "stream": True, "max_output_tokens": 3, "store": False}),
        ("/v1/messages", {"model": "llmsim/sim-model", "messages": HELLO, "stream": True, "max_tokens": 3}),
    ],
)
async def test_the_response_is_freed_when_the_request_ends(
    autojump_clock: MockClock, no_cycle_collector: None, path: str, body: dict[str, Any]
) -> None:
    async with running() as sim:
        response = await post(sim, path, body, response=FakeResponse())
        assert response.status == 200
        freed = weakref.ref(response)
        del response
        assert freed() is None
