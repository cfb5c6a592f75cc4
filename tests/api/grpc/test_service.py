"""The VllmEngine service through the real router, engine and text generator, on trio's
mock clock: what each call writes, when, and the status it ends with."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from trio.testing import MockClock

from llmsim.api.grpc.health import HealthCheckRequest, HealthCheckResponse
from llmsim.api.grpc.wire import frame, unframe
from llmsim.api.http import HttpRequest
from llmsim.app import Simulator
from tests.api.fakes import FakeResponse, running

SERVICE = "/vllm.grpc.engine.VllmEngine/"
LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}


async def call(
    sim: Simulator,
    method: str,
    message: Any = None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    body: bytes = b"",
    received_at: float | None = None,
) -> FakeResponse:
    request = HttpRequest(
        "POST",
        method if method.startswith("/") else SERVICE + method,
        headers=((b"content-type", b"application/grpc"), (b"te", b"trailers"), *headers),
        body=frame(message.SerializeToString()) if message is not None else body,
        http_version="2",
        received_at=received_at,
    )
    response = FakeResponse()
    await sim.app.handle(request, response)
    return response


def generate(request_id: str = "g", *, max_tokens: int = 4, stream: bool = True, **params: Any) -> Any:
    sampling = pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)
    return pb.GenerateRequest(
        request_id=request_id, tokenized=pb.TokenizedInput(input_ids=[5, 6, 7]), sampling_params=sampling, stream=stream
    )


def replies(response: FakeResponse) -> list[Any]:
    return [pb.GenerateResponse.FromString(message) for message in unframe(response.body)]


def status(response: FakeResponse) -> int:
    assert response.status == 200 and response.headers[b"content-type"] == b"application/grpc"
    return int(response.trailers[b"grpc-status"])


async def test_a_stream_sends_a_chunk_per_token_at_ttft_then_every_itl(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        began = trio.current_time()
        response = await call(sim, "Generate", generate())
    assert status(response) == 0 and b"grpc-message" not in response.trailers
    times = [when - began for when, data in response.writes if data]
    assert times == pytest.approx([0.1, 0.11, 0.12, 0.13], abs=0.0021)  # the 2 ms step grid
    kinds = [reply.WhichOneof("response") for reply in replies(response)]
    assert kinds == ["chunk", "chunk", "chunk", "chunk", "complete"]
    last = replies(response)[-1].complete
    assert last.finish_reason == "length" and last.completion_tokens == 1 and last.prompt_tokens == 3


@pytest.mark.parametrize("stream", [True, False])
async def test_a_call_is_timed_from_its_first_byte(autojump_clock: MockClock, stream: bool) -> None:
    """As on every endpoint (tests/test_app.py): the jobs arrive when the request's first
    bytes did, so vLLM's TTFT (and a client's) does not count reading and planning."""
    async with running(**LATENCY) as sim:
        received = trio.current_time()
        await trio.sleep(0.0123)
        response = await call(sim, "Generate", generate(stream=stream), received_at=received)
    assert status(response) == 0
    last_token = received + 0.1 + 3 * 0.01  # 4 tokens: TTFT, then 3 ITLs (the 2 ms grid: within 1 ms)
    assert max(when for when, _ in response.writes) == pytest.approx(last_token, abs=0.0011)
    ttft = sim.engine.metrics.snapshot().histograms["time_to_first_token_seconds"]
    assert ttft.count == 1 and ttft.sum == pytest.approx(LATENCY["time_to_first_token"], abs=0.0011)


async def test_the_same_request_id_plans_the_same_tokens_streaming_or_not(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        streamed = replies(await call(sim, "Generate", generate("same", max_tokens=6)))
        whole = replies(await call(sim, "Generate", generate("same", max_tokens=6, stream=False)))
    assert [t for reply in streamed[:-1] for t in reply.chunk.token_ids] == list(whole[0].complete.output_ids)


async def test_grpc_timeout_ends_the_call_with_deadline_exceeded_and_frees_the_slot(
    autojump_clock: MockClock,
) -> None:
    async with running(time_to_first_token=0.1, inter_token_latency=0.02) as sim:
        began = trio.current_time()
        response = await call(sim, "Generate", generate(max_tokens=100), headers=((b"grpc-timeout", b"175m"),))
        assert trio.current_time() - began == pytest.approx(0.175)
        assert sim.ctx.engine.statistics().running == 0
    assert status(response) == 4 and response.trailers[b"grpc-message"] == b"Deadline Exceeded"
    assert [reply.WhichOneof("response") for reply in replies(response)] == ["chunk"] * 4  # at 100, 120, 140, 160 ms


async def test_abort_ends_a_running_call_with_finish_reason_abort(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        results: dict[str, FakeResponse] = {}

        async def victim() -> None:
            results["victim"] = await call(sim, "Generate", generate("victim", max_tokens=100, n=2))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(victim)
            await trio.sleep(0.125)  # (mock clock) two tokens in
            results["abort"] = await call(sim, "Abort", pb.AbortRequest(request_ids=["victim"]))
        assert sim.ctx.engine.statistics().running == 0
    assert status(results["abort"]) == 0 and replies(results["abort"]) == [pb.GenerateResponse()]  # AbortResponse{}
    response = results["victim"]
    assert status(response) == 0
    ends = [reply.complete for reply in replies(response) if reply.WhichOneof("response") == "complete"]
    assert [(end.index, end.finish_reason, len(end.output_ids)) for end in ends] == [(0, "abort", 0), (1, "abort", 0)]


async def test_abort_of_a_call_not_streamed_answers_the_tokens_so_far(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        results: dict[str, FakeResponse] = {}

        async def victim() -> None:
            results["victim"] = await call(sim, "Generate", generate("whole", max_tokens=100, stream=False))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(victim)
            await trio.sleep(0.135)  # (mock clock) four tokens in
            await call(sim, "Abort", pb.AbortRequest(request_ids=["whole"]))
    [reply] = replies(results["victim"])
    assert reply.complete.finish_reason == "abort" and len(reply.complete.output_ids) == 4


@pytest.mark.parametrize(
    "path",
    [SERVICE + "FlushCache", SERVICE + "Nope", "/grpc.reflection.v1alpha.ServerReflection/Info", "/x"],
)
async def test_methods_not_served_answer_unimplemented_at_once(path: str) -> None:
    async with running() as sim:
        response = await call(sim, path, body=frame(b""))
    assert status(response) == 12 and response.body == b""  # HEADERS, then the trailers: no message


@pytest.mark.parametrize(
    ("method", "body", "headers", "code"),
    [
        ("Generate", b"\x00\x00\x00\x00\x02\xff\xff", (), 13),  # not a GenerateRequest
        ("HealthCheck", b"", (), 13),  # no request message
        ("HealthCheck", frame(b"") * 2, (), 13),  # two of them
        ("HealthCheck", frame(b""), ((b"grpc-timeout", b"soon"),), 13),
        ("Generate", frame(generate().SerializeToString()), ((b"x-return-error", b"404"),), 5),
        ("Generate", frame(generate().SerializeToString()), ((b"x-return-error", b"429"),), 8),
        ("Generate", frame(generate(max_tokens=1, min_tokens=5).SerializeToString()), (), 3),
        ("Generate", frame(pb.GenerateRequest().SerializeToString()), (), 3),  # no input
        ("Embed", frame(pb.EmbedRequest().SerializeToString()), (), 3),
    ],
)
async def test_refusals_end_the_call_with_a_status_and_no_message(
    method: str, body: bytes, headers: tuple[tuple[bytes, bytes], ...], code: int
) -> None:
    async with running() as sim:
        response = await call(sim, method, body=body, headers=headers)
        assert sim.ctx.engine.statistics().submitted == 0
    assert status(response) == code and response.body == b""
    assert response.trailers[b"grpc-message"]


async def test_a_status_message_says_what_http_would_have_said() -> None:
    async with running(max_model_len=8) as sim:
        long_prompt = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=list(range(1, 20))))
        refused = await call(sim, "Generate", long_prompt)
    assert status(refused) == 3
    assert b"maximum context length is 8 tokens" in refused.trailers[b"grpc-message"]


async def test_the_standard_health_service_checks_the_server_and_the_engine(autojump_clock: MockClock) -> None:
    """grpc.health.v1.Health, as vLLM's --grpc server registers it beside VllmEngine: the
    engine NOT_SERVING while the start-up duration runs, an unknown service NOT_FOUND."""

    async def check(sim: Simulator, service: str, method: str = "Check") -> tuple[int, Any]:
        response = await call(sim, f"/grpc.health.v1.Health/{method}", HealthCheckRequest(service=service))
        messages = [HealthCheckResponse.FromString(message) for message in unframe(response.body)]
        return status(response), messages

    async with running(startup_duration=1.0) as sim:
        assert await check(sim, "") == (0, [HealthCheckResponse(status=1)])
        assert await check(sim, "vllm.grpc.engine.VllmEngine") == (0, [HealthCheckResponse(status=2)])
        await trio.sleep(1.0)
        assert await check(sim, "vllm.grpc.engine.VllmEngine") == (0, [HealthCheckResponse(status=1)])
        assert await check(sim, "other") == (5, [])
        assert await check(sim, "other", "Watch") == (0, [HealthCheckResponse(status=3)])
