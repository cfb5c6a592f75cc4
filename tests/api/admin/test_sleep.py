"""vLLM 0.33's sleep mode: ``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``
(vllm/entrypoints/serve/dev/sleep/api_router.py:26-61) and what happens to requests while
the engine sleeps (vllm/v1/engine/core.py:993-1080, 2181-2233), on a real server with httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing
from trio.testing import MockClock

from llmsim.api.admin import SleepState
from llmsim.api.admin.routes import DRAIN_POLL_INTERVAL
from llmsim.api.http import HttpRequest
from llmsim.app import Simulator
from llmsim.testing import open_simulator
from tests.api.fakes import FakeResponse, post, running, sse_payloads

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


# verify=False: plain HTTP, and a verifying client loads the CA bundle first (~0.1 s each)
@asynccontextmanager
async def serving(**config: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = {"enable_sleep_mode": True, **config}
    async with (
        open_simulator(**config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30, verify=False) as client,
    ):
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
    assert held == still_held == ["stream head 200"]  # queued in the engine: the head goes out at once
    assert sorted(done) == ["completion 200", "stream end", "stream head 200"]


async def test_a_request_made_while_asleep_waits_in_the_engine_and_can_leave(autojump_clock: MockClock) -> None:
    """vLLM queues it in the paused scheduler (core.py:2225-2233): it counts as waiting, its
    queue time runs, and a client that leaves while it waits leaves nothing behind."""
    async with running(enable_sleep_mode=True) as sim:
        asleep = FakeResponse()
        await sim.app.handle(HttpRequest("POST", "/sleep", query="level=1"), asleep)
        held = FakeResponse()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, sim, "/v1/chat/completions", CHAT, (), held)
            leaving = trio.CancelScope()

            async def leaves() -> None:
                with leaving:
                    await post(sim, "/v1/chat/completions", CHAT)

            nursery.start_soon(leaves)
            await trio.testing.wait_all_tasks_blocked()
            while_asleep = sim.engine.statistics()
            leaving.cancel()
            await trio.testing.wait_all_tasks_blocked()
            after_leaving = sim.engine.statistics()
            await trio.sleep(1.0)
            await sim.app.handle(HttpRequest("POST", "/wake_up"), FakeResponse())
        after = sim.engine.statistics()
        queue_time = sim.engine.metrics.snapshot().histograms["request_queue_time_seconds"]
    assert asleep.status == 200
    assert (while_asleep.submitted, while_asleep.waiting, while_asleep.running) == (2, 2, 0)
    assert (after_leaving.waiting, after_leaving.cancelled) == (1, 1)
    assert (after.finished, held.status) == (1, 200)
    assert queue_time.count == 1 and queue_time.sum >= 1.0  # the time asleep is queue time


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_mode_abort_ends_a_stream_in_flight_with_finish_reason_abort(
    backend: str, autojump_clock: MockClock
) -> None:
    """vLLM's default ``mode=abort`` ends every request in flight (core.py:2209-2213): the
    stream gets a finishing chunk with no new text and ``finish_reason: "abort"``
    (chat_completion/serving.py:796-813; completion/serving.py:437-462), then ends as usual."""
    order: list[str] = []
    async with serving(server=backend, inter_token_latency=0.005) as client:
        body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.aiter_lines()
            await lines.__anext__()
            assert (await client.post("/sleep")).status_code == 200
            order.append("slept")
            rest = [line async for line in lines if line]
            order.append("stream end")
    assert order == ["slept", "stream end"]
    assert rest[-1] == "data: [DONE]"
    assert '"text":"","logprobs":null,"finish_reason":"abort","stop_reason":null' in rest[-2]
    assert len(rest) < 40


LATENCY = {"enable_sleep_mode": True, "time_to_first_token": 0.1, "inter_token_latency": 0.02, "seed": 1}
LONG = {"max_tokens": 50, "ignore_eos": True}
#: Requests posted at 0 get tokens at 0.1, 0.12, 0.14...: three are out at 0.15.
THREE_TOKENS_OUT = 0.15


async def admin(sim: Simulator, path: str, query: str = "") -> FakeResponse:
    response = FakeResponse()
    await sim.app.handle(HttpRequest("POST", path, query=query), response)
    assert response.status == 200, response.body
    return response


async def test_mode_abort_ends_a_chat_stream_with_vllms_last_chunk(autojump_clock: MockClock) -> None:
    """The abort output has no text: without a parser the delta is ``{"content": ""}``
    (chat_completion/stream_processor.py:91-92), with the finish reason as the engine
    gives it (``resolve_finish_reason`` leaves ``abort`` alone)."""
    stream = FakeResponse()
    async with running(**LATENCY) as sim, trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(post, sim, "/v1/chat/completions", {**CHAT, **LONG, "stream": True}, (), stream)
        await trio.sleep_until(start + THREE_TOKENS_OUT)
        await admin(sim, "/sleep", "mode=abort")
    payloads = sse_payloads(stream.body)
    assert payloads[-1] == "[DONE]"
    assert len(payloads) == 1 + 3 + 1 + 1  # role, three tokens, the abort chunk, [DONE]
    assert all(list(payload["choices"][0]["delta"]) == ["content"] for payload in payloads[1:-2])
    assert payloads[-2]["choices"] == [
        {
            "index": 0,
            "delta": {"content": ""},
            "logprobs": None,
            "finish_reason": "abort",
            "stop_reason": None,
            "token_ids": None,
            "weight_versions": None,
        }
    ]


async def test_mode_abort_before_the_first_token_sends_the_role_and_an_empty_delta(autojump_clock: MockClock) -> None:
    """Finished without output: vLLM sends the role chunk, then a bare ``DeltaMessage()``
    (chat_completion/stream_processor.py:73-75)."""
    stream = FakeResponse()
    async with running(**LATENCY) as sim, trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(post, sim, "/v1/chat/completions", {**CHAT, **LONG, "stream": True}, (), stream)
        await trio.sleep_until(start + 0.05)
        await admin(sim, "/sleep")
    payloads = sse_payloads(stream.body)
    assert [payload["choices"][0]["delta"] for payload in payloads[:-1]] == [{"role": "assistant", "content": ""}, {}]
    assert payloads[-2]["choices"][0]["finish_reason"] == "abort"


def _events(body: bytes) -> list[tuple[str, Any]]:
    """``(name, data)`` of each ``event:`` + ``data:`` event."""
    events = []
    for event in body.decode().split("\n\n")[:-1]:
        name, data = event.split("\n", 1)
        events.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return events


async def test_mode_abort_ends_responses_and_messages_streams(autojump_clock: MockClock) -> None:
    """Responses: the item closes ``completed`` with the text sent, then
    ``response.completed`` (``response_item_status`` marks only ``length``,
    responses/utils.py:103-107).  Messages: ``message_delta`` with ``stop_reason`` null."""
    streams = {"/v1/responses": FakeResponse(), "/v1/messages": FakeResponse()}
    async with running(**LATENCY) as sim, trio.open_nursery() as nursery:
        start = trio.current_time()
        for path, stream in streams.items():
            nursery.start_soon(post, sim, path, {**GENERATING[path], "stream": True}, (), stream)
        await trio.sleep_until(start + THREE_TOKENS_OUT)
        await admin(sim, "/sleep")
    responses = _events(streams["/v1/responses"].body)
    deltas = "".join(data["delta"] for name, data in responses if name == "response.output_text.delta")
    done = {name: data for name, data in responses}
    assert responses[-1][0] == "response.completed"
    assert done["response.output_text.done"]["text"] == deltas != ""
    assert done["response.output_item.done"]["item"]["status"] == "completed"
    assert responses[-1][1]["response"]["usage"]["output_tokens"] == 3
    assert [data["sequence_number"] for _, data in responses] == list(range(len(responses)))
    messages = _events(streams["/v1/messages"].body)
    assert [name for name, _ in messages[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert messages[-2][1]["delta"] == {"stop_reason": None, "stop_sequence": None}
    assert messages[-2][1]["usage"] == {"output_tokens": 3}


async def _aborted_bodies(sim: Simulator, requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Post each request (not streaming), abort them all once three tokens are out, and
    answer each complete response's JSON."""
    responses = {path: FakeResponse() for path in requests}
    headers = ((b"x-request-id", b"fixed"),)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        for path, body in requests.items():
            nursery.start_soon(post, sim, path, body, headers, responses[path])
        await trio.sleep_until(start + THREE_TOKENS_OUT)
        await admin(sim, "/sleep", "mode=abort&level=0")
    assert all(response.status == 200 for response in responses.values())
    return {path: response.json() for path, response in responses.items()}


async def _full_bodies(sim: Simulator, requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    headers = ((b"x-request-id", b"fixed"),)
    return {path: (await post(sim, path, body, headers)).json() for path, body in requests.items()}


GENERATING = {
    "/v1/chat/completions": {**CHAT, **LONG},
    "/v1/completions": {"prompt": "hi", **LONG},
    "/v1/responses": {"input": "hi", "max_output_tokens": 50},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50},
}


async def test_mode_abort_answers_complete_responses_with_what_was_generated(autojump_clock: MockClock) -> None:
    """Each family renders the abort as vLLM does: chat and completions say
    ``finish_reason: "abort"``; responses is ``completed`` (SimpleContext marks only
    ``length``, responses/serving.py:791-795,856-859); messages has ``stop_reason``
    null (anthropic/serving.py:131-134).  The text is the three tokens generated."""
    async with running(**LATENCY) as sim:
        aborted = await _aborted_bodies(sim, GENERATING)
        await admin(sim, "/wake_up")
        full = await _full_bodies(sim, GENERATING)

    chat, completion = aborted["/v1/chat/completions"], aborted["/v1/completions"]
    assert chat["choices"][0]["finish_reason"] == completion["choices"][0]["finish_reason"] == "abort"
    assert chat["usage"]["completion_tokens"] == completion["usage"]["completion_tokens"] == 3
    response, message = aborted["/v1/responses"], aborted["/v1/messages"]
    assert (response["status"], response["usage"]["output_tokens"]) == ("completed", 3)
    assert response["output"][0]["status"] == "completed"
    assert (message["stop_reason"], message["stop_sequence"], message["usage"]["output_tokens"]) == (None, None, 3)
    texts = {
        "/v1/chat/completions": lambda body: body["choices"][0]["message"]["content"],
        "/v1/completions": lambda body: body["choices"][0]["text"],
        "/v1/responses": lambda body: body["output"][0]["content"][0]["text"],
        "/v1/messages": lambda body: body["content"][0]["text"],
    }
    for path, text in texts.items():
        cut, whole = text(aborted[path]), text(full[path])
        assert cut and whole.startswith(cut) and len(cut) < len(whole), path


async def test_aborted_requests_count_as_finished_with_reason_abort(autojump_clock: MockClock) -> None:
    """vLLM counts an engine-side abort in ``request_success{finished_reason="abort"}``
    (output_processor.py:868-887, loggers.py:1289-1292): the running request and the one
    waiting for its slot both."""
    async with running(**LATENCY, max_num_seqs=1) as sim:
        await _aborted_bodies(
            sim, {"/v1/completions": {"prompt": "hi", **LONG}, "/v1/chat/completions": {**CHAT, **LONG}}
        )
        scrape = FakeResponse()
        await sim.app.handle(HttpRequest("GET", "/metrics"), scrape)
    lines = scrape.body.decode().splitlines()
    (abort,) = [line for line in lines if line.startswith("vllm:request_success_total") and '"abort"' in line]
    assert abort.endswith(" 2.0")


async def test_mode_keep_freezes_requests_in_flight_until_fully_awake(autojump_clock: MockClock) -> None:
    """``mode=keep`` pauses everything (PAUSED_ALL, scheduler.py:723-725); the requests go
    on once the engine is fully awake, on their schedule shifted by the time asleep."""
    stream = FakeResponse()
    async with running(**LATENCY) as sim, trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(post, sim, "/v1/completions", {"prompt": "hi", **LONG, "stream": True}, (), stream)
        await trio.sleep_until(start + THREE_TOKENS_OUT)
        await admin(sim, "/sleep", "mode=keep")
        await trio.sleep_until(start + 10)
        frozen = len(stream.writes)
        await admin(sim, "/wake_up", "tags=weights")  # kv_cache still asleep: still frozen
        await trio.sleep_until(start + 20)
        still_frozen = len(stream.writes)
        await admin(sim, "/wake_up", "tags=kv_cache")
    times = [when - start for when, _ in stream.writes]
    assert frozen == still_frozen == 3
    assert times[3] == pytest.approx(0.16 + 20 - THREE_TOKENS_OUT, abs=0.003)  # due at 0.16, 19.85 s asleep
    payloads = sse_payloads(stream.body)
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for payload in payloads[:-1] if payload["choices"]) == 50


async def test_mode_wait_leaves_queued_requests_queued(autojump_clock: MockClock) -> None:
    """Under PAUSED_NEW only running requests are scheduled (scheduler.py:1049-1066): the
    request waiting for the one slot starts only after the wake-up."""
    first, second = FakeResponse(), FakeResponse()
    async with running(**LATENCY, max_num_seqs=1) as sim, trio.open_nursery() as nursery:
        start = trio.current_time()
        body = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True}
        nursery.start_soon(post, sim, "/v1/completions", body, (), first)
        await trio.sleep_until(start + 0.001)  # first takes the one slot
        nursery.start_soon(post, sim, "/v1/completions", body, (), second)
        await trio.sleep_until(start + 0.01)
        await admin(sim, "/sleep", "mode=wait")
        slept_at = trio.current_time() - start
        await trio.sleep_until(start + 5)
        held = second.status
        await admin(sim, "/wake_up")
    assert 0.14 <= slept_at <= 0.14 + DRAIN_POLL_INTERVAL + 0.001  # the first request's last token, polled
    assert (first.status, held, second.status) == (200, None, 200)
    assert second.writes[0][0] - start == pytest.approx(5.14, abs=0.003)


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
