"""vLLM 0.33's sleep mode: ``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``
(vllm/entrypoints/serve/dev/sleep/api_router.py:26-61) and what happens to requests while
the engine sleeps (vllm/v1/engine/core.py:993-1080, 2181-2233), on a real server with httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from trio.testing import MockClock

from llmsim.api.admin import SleepState
from llmsim.testing import open_simulator
from tests.api.fakes import FakeResponse, post, running

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@asynccontextmanager
async def serving(**config: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = {"enable_sleep_mode": True, **config}
    async with open_simulator(**config) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


async def is_sleeping(client: httpx.AsyncClient) -> bool:
    response = await client.get("/is_sleeping")
    assert response.status_code == 200
    value: bool = response.json()["is_sleeping"]
    return value


async def test_without_enable_sleep_mode_the_routes_are_not_found() -> None:
    """vLLM registers them only in dev mode (vllm/entrypoints/launchers/api_server/routers.py:46-49)."""
    async with serving(enable_sleep_mode=False) as client:
        responses = [await client.post("/sleep"), await client.post("/wake_up"), await client.get("/is_sleeping")]
    assert [response.status_code for response in responses] == [404, 404, 404]
    assert responses[0].json()["error"]["message"] == "Not Found: no route for /sleep"


async def test_sleep_and_wake_up_answer_vllms_bodies() -> None:
    async with serving() as client:
        awake = await client.get("/is_sleeping")
        slept = await client.post("/sleep")
        asleep = await client.get("/is_sleeping")
        woken = await client.post("/wake_up")
        after = await is_sleeping(client)
    assert awake.content == b'{"is_sleeping":false}'
    assert slept.content == b'{"status":"sleeping","level":1}'  # level 1 by default
    assert asleep.content == b'{"is_sleeping":true}'
    assert woken.content == b'{"status":"awake","tags":null}'
    assert {r.headers["content-type"] for r in (awake, slept, woken)} == {"application/json"}
    assert after is False


#: (request, its answer, is_sleeping after it): vLLM's pools ("weights", "kv_cache") and
#: its paused scheduler (core.py:1031-1056; executor/abstract.py:400-435).
WAKE_UP_STEPS = [
    ("/sleep?level=2", {"status": "sleeping", "level": 2}, True),
    ("/wake_up?tags=weights", {"status": "sleeping", "tags": ["weights"]}, True),
    ("/wake_up?tags=weights", {"status": "sleeping", "tags": ["weights"]}, True),  # already awake: no-op
    ("/wake_up?tags=kv_cache&tags=bogus", {"status": "sleeping", "tags": ["kv_cache", "bogus"]}, True),  # no-op
    ("/wake_up?tags=scheduling", {"status": "sleeping", "tags": ["scheduling"]}, True),  # a pool still sleeps
    ("/wake_up?tags=kv_cache", {"status": "awake", "tags": ["kv_cache"]}, False),
    ("/sleep?level=0", {"status": "sleeping", "level": 0}, True),  # the scheduler only
    ("/wake_up?tags=scheduling", {"status": "awake", "tags": ["scheduling"]}, False),
    ("/sleep?level=1&level=2", {"status": "sleeping", "level": 2}, True),  # FastAPI: the last value wins
    ("/wake_up?tags=", {"status": "sleeping", "tags": [""]}, True),
    ("/wake_up", {"status": "awake", "tags": None}, False),
    ("/wake_up", {"status": "awake", "tags": None}, False),
]


async def test_wake_up_by_tags_follows_vllms_pools() -> None:
    seen = []
    async with serving() as client:
        for path, _, _ in WAKE_UP_STEPS:
            response = await client.post(path)
            seen.append((path, response.json(), await is_sleeping(client)))
    assert seen == WAKE_UP_STEPS


def _level_error(kind: str, text: str, should_be: str, ctx: str = "") -> str:
    return f"{{'type': '{kind}', 'loc': 'query.level', 'msg': 'Input should be {should_be}', 'input': '{text}'{ctx}}}"


NOT_AN_INTEGER = "a valid integer, unable to parse string as an integer"
MODE_ERROR = (
    "{'type': 'literal_error', 'loc': 'query.mode', 'msg': \"Input should be 'abort', 'wait' or 'keep'\", "
    "'input': 'later', 'ctx': {'expected': \"'abort', 'wait' or 'keep'\"}}"
)


@pytest.mark.parametrize(
    ("query", "errors", "param"),
    [
        ("level=3", [_level_error("less_than_equal", "3", "less than or equal to 2", ", 'ctx': {'le': 2}")], "level"),
        (
            "level=-1",
            [_level_error("greater_than_equal", "-1", "greater than or equal to 0", ", 'ctx': {'ge': 0}")],
            "level",
        ),
        ("level=one", [_level_error("int_parsing", "one", NOT_AN_INTEGER)], "level"),
        ("level=1.5", [_level_error("int_parsing", "1.5", NOT_AN_INTEGER)], "level"),
        ("level=", [_level_error("int_parsing", "", NOT_AN_INTEGER)], "level"),
        ("mode=later", [MODE_ERROR], "mode"),
        (
            "mode=later&level=9",
            [_level_error("less_than_equal", "9", "less than or equal to 2", ", 'ctx': {'le': 2}"), MODE_ERROR],
            "level",
        ),
    ],
)
async def test_bad_query_parameters_are_fastapis_400(query: str, errors: list[str], param: str) -> None:
    """``level: Query(ge=0, le=2)`` and ``mode: PauseMode``, as vLLM renders FastAPI's
    RequestValidationError (vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196)."""
    async with serving() as client:
        response = await client.post(f"/sleep?{query}")
        still_awake = not await is_sleeping(client)
    label = "error" if len(errors) == 1 else "errors"
    expected = f"{len(errors)} validation {label}:\n" + "\n".join(f"  {error}" for error in errors)
    assert response.status_code == 400
    assert response.json() == {
        "error": {"message": expected, "type": "Bad Request", "param": f"query.{param}", "code": 400}
    }
    assert still_awake


async def test_a_valid_level_is_read_as_pydantic_reads_integers() -> None:
    async with serving() as client:
        response = await client.post("/sleep?level=+2.0&mode=keep")
    assert response.json() == {"status": "sleeping", "level": 2}


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_requests_wait_while_asleep_and_run_once_fully_awake(backend: str) -> None:
    """Sleep pauses the scheduler without rejecting new requests (core.py:2225-2233): they
    queue until ``wake_up`` leaves no pool asleep, then run (stream or not)."""
    done: list[str] = []
    async with serving(server=backend) as client:

        async def streaming() -> None:
            async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
                done.append(f"stream head {response.status_code}")
                body = b"".join([chunk async for chunk in response.aiter_bytes()])
            assert body.endswith(b"data: [DONE]\n\n")
            done.append("stream end")

        async def complete() -> None:
            response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
            done.append(f"completion {response.status_code}")

        assert (await client.post("/sleep?level=1")).status_code == 200
        async with trio.open_nursery() as nursery:
            nursery.start_soon(streaming)
            nursery.start_soon(complete)
            await trio.testing.wait_all_tasks_blocked(0.05)
            held = list(done)
            await client.post("/wake_up?tags=weights")  # kv_cache still asleep: the scheduler stays paused
            await trio.testing.wait_all_tasks_blocked(0.05)
            still_held = list(done)
            await client.post("/wake_up?tags=kv_cache")
    assert held == still_held == []
    assert sorted(done) == ["completion 200", "stream end", "stream head 200"]


async def test_a_held_request_never_reaches_the_engine_and_can_leave(autojump_clock: MockClock) -> None:
    """The gate is in front of the engine: a held request holds no slot, and a client
    that leaves while held leaves nothing behind."""
    async with running(enable_sleep_mode=True) as sim:
        sim.ctx.sleep.sleep(1)
        held = FakeResponse()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, sim, "/v1/chat/completions", CHAT, (), held)
            leaving = trio.CancelScope()

            async def leaves() -> None:
                with leaving:
                    await post(sim, "/v1/chat/completions", CHAT)

            nursery.start_soon(leaves)
            await trio.testing.wait_all_tasks_blocked()
            while_asleep, status_while_asleep = sim.engine.statistics(), held.status
            leaving.cancel()
            await trio.testing.wait_all_tasks_blocked()
            sim.ctx.sleep.wake_up(None)
        after = sim.engine.statistics()
    assert (while_asleep.submitted, while_asleep.waiting, status_while_asleep) == (0, 0, None)
    assert (after.submitted, after.finished, held.status) == (1, 1, 200)


async def test_requests_in_flight_run_to_their_end(autojump_clock: MockClock) -> None:
    """vLLM's default ``mode=abort`` would end them with ``finish_reason: "abort"``; the
    simulated engine cannot end a job early yet, so they finish (documented)."""
    order: list[str] = []
    async with serving(inter_token_latency=0.005) as client:
        body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.aiter_lines()
            await lines.__anext__()
            assert (await client.post("/sleep")).status_code == 200
            order.append("slept")
            rest = [line async for line in lines if line]
            order.append("stream end")
    assert order == ["slept", "stream end"]
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]


async def test_mode_wait_answers_once_the_requests_in_flight_are_done(autojump_clock: MockClock) -> None:
    """``mode=wait``: the pause completes when the engine has drained (core.py:2196-2223)."""
    order: list[str] = []
    async with serving(inter_token_latency=0.005) as client:
        body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.aiter_lines()
            await lines.__anext__()

            async def sleep() -> None:
                answer = await client.post("/sleep?mode=wait&level=2")
                order.append(f"slept {answer.json()}")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sleep)
                _ = [line async for line in lines]
                order.append("stream end")
        sleeping = await is_sleeping(client)
    assert order == ["stream end", "slept {'status': 'sleeping', 'level': 2}"]
    assert sleeping


@pytest.mark.parametrize(
    ("calls", "gauge"),
    [
        ([], (1, 0, 0)),
        ([("sleep", 0)], (0, 0, 0)),
        ([("sleep", 1)], (0, 1, 0)),
        ([("sleep", 2)], (0, 0, 1)),
        ([("sleep", 1), ("sleep", 2)], (0, 0, 1)),  # AsyncLLM records the level asked for
        ([("sleep", 1), ("wake_up", ("weights",))], (0, 1, 0)),  # a partial wake-up changes nothing
        ([("sleep", 2), ("wake_up", None)], (1, 0, 0)),
    ],
)
def test_the_sleep_state_gauge_follows_vllms_record_sleep_state(
    calls: list[tuple[str, Any]], gauge: tuple[int, int, int]
) -> None:
    """vllm/v1/metrics/loggers.py:1335-1352 and the calls of async_llm.py:1198-1220."""
    state = SleepState()
    for name, argument in calls:
        getattr(state, name)(argument)
    values = state.sleep_state_gauge()
    assert list(values) == ["awake", "weights_offloaded", "discard_all"]
    assert tuple(values.values()) == gauge
