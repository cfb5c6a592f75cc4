"""vLLM's gRPC service (``vllm.grpc.engine.VllmEngine``) on llmsim's HTTP port, driven by
the real ``grpcio`` client (run in a worker thread: grpcio has its own event loop) and,
where the wire itself is the point, by a bare h2 client."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import httpx
import pytest
import trio
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

import llmsim
from llmsim.api.grpc.wire import frame, unframe
from llmsim.config import Config
from llmsim.server import ServerHandle
from tests.protocol.helpers import H2Client

T = TypeVar("T")
MODEL = "grpc-model"


async def start(nursery: trio.Nursery, **config: object) -> ServerHandle:
    settings: dict[str, object] = {"port": 0, "served_model_name": (MODEL,), "seed": 7, **config}
    return await nursery.start(llmsim.serve, Config(**settings))  # type: ignore[arg-type]


def target(server: ServerHandle) -> str:
    return f"{server.host}:{server.port}"


async def in_thread(server: ServerHandle, calls: Callable[[pb_grpc.VllmEngineStub], T]) -> T:
    """``calls(stub)`` with a fresh grpcio channel, in a worker thread."""

    def run() -> T:
        with grpc.insecure_channel(target(server)) as channel:
            return calls(pb_grpc.VllmEngineStub(channel))

    return await trio.to_thread.run_sync(run)


async def metric(server: ServerHandle, name: str) -> float:
    """The value of ``name`` (one sample, the served model's) on /metrics."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{server.url}/metrics")).text
    (value,) = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name + "{")]
    return float(value)


def generate_request(request_id: str, *, max_tokens: int = 5, stream: bool = True, **params: Any) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)
    return pb.GenerateRequest(
        request_id=request_id, tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]), sampling_params=sampling, stream=stream
    )


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_generate_streams_chunks_then_a_complete(nursery: trio.Nursery, backend: str) -> None:
    server = await start(nursery, time_to_first_token=0.01, inter_token_latency=0.01, server=backend)
    responses = await in_thread(server, lambda stub: list(stub.Generate(generate_request("r1"), timeout=10)))
    kinds = [response.WhichOneof("response") for response in responses]
    chunks = [response.chunk for response in responses[:-1]]
    # One chunk per engine step: one per token, unless a loaded machine makes the engine
    # hand over two late tokens in one step (as vLLM's would).
    assert kinds == ["chunk"] * len(chunks) + ["complete"] and 3 <= len(chunks) <= 5
    tokens = [token for chunk in chunks for token in chunk.token_ids]
    assert len(tokens) == 5 and all(chunk.completion_tokens == len(chunk.token_ids) for chunk in chunks)
    assert all(chunk.prompt_tokens == 3 for chunk in chunks)
    complete = responses[-1].complete
    assert complete.finish_reason == "length" and complete.prompt_tokens == 3
    assert list(complete.output_ids) == tokens[-1:]  # the last delta, as vLLM's servicer sends it


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_generate_over_tls(nursery: trio.Nursery, tmp_path: Path, backend: str) -> None:
    """TLS with ALPN h2, the client checking the server's certificate."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    pem = str(tmp_path / "server.pem")
    server = await start(nursery, ssl_certfile=pem, ssl_keyfile=pem, server=backend)
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())

    def run() -> list[pb.GenerateResponse]:
        with grpc.secure_channel(f"localhost:{server.port}", credentials) as channel:
            return list(pb_grpc.VllmEngineStub(channel).Generate(generate_request("tls"), timeout=10))

    responses = await trio.to_thread.run_sync(run)
    assert responses[-1].complete.finish_reason == "length" and responses[-1].complete.completion_tokens == 5


async def test_generate_without_stream_answers_one_complete_with_every_token(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    request = generate_request("r2", max_tokens=7, stream=False, n=2)
    responses = await in_thread(server, lambda stub: list(stub.Generate(request, timeout=10)))
    assert [response.WhichOneof("response") for response in responses] == ["complete", "complete"]
    assert [response.complete.index for response in responses] == [0, 1]
    assert all(len(response.complete.output_ids) == 7 for response in responses)
    assert all(response.complete.completion_tokens == 7 for response in responses)


async def test_generate_takes_text_and_honours_stop_token_ids(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    first = await in_thread(server, lambda stub: list(stub.Generate(generate_request("r3", stream=False), timeout=10)))
    stop_id = first[0].complete.output_ids[2]
    request = generate_request("r3", stream=False, stop_token_ids=[stop_id])
    stopped = await in_thread(server, lambda stub: list(stub.Generate(request, timeout=10)))
    complete = stopped[0].complete
    assert complete.finish_reason == "stop" and complete.matched_token_id == stop_id
    assert list(complete.output_ids) == list(first[0].complete.output_ids[:3])
    text = pb.GenerateRequest(request_id="t", text="hello there", sampling_params=pb.SamplingParams(max_tokens=2))
    answered = await in_thread(server, lambda stub: list(stub.Generate(text, timeout=10)))
    assert answered[-1].complete.prompt_tokens > 0


@pytest.mark.usefixtures("settled_heap")
async def test_100_concurrent_streams_keep_the_configured_ttft_and_itl(nursery: trio.Nursery) -> None:
    """100 grpc.aio streams at once: each one's first token about TTFT after the call,
    and its tokens about ITL apart (the machine may be loaded: medians, generous bounds)."""
    ttft, itl, tokens = 0.1, 0.02, 20
    server = await start(nursery, time_to_first_token=ttft, inter_token_latency=itl, max_num_seqs=128)

    async def one(stub: pb_grpc.VllmEngineStub, index: int) -> tuple[float, list[float], int]:
        """The call's TTFT, the gaps between its one-token chunks, and its token count."""
        began = time.perf_counter()
        arrivals, count = [], 0
        async for response in stub.Generate(generate_request(f"c{index}", max_tokens=tokens), timeout=30):
            if response.WhichOneof("response") == "chunk":
                arrivals.append((time.perf_counter(), len(response.chunk.token_ids)))
                count += len(response.chunk.token_ids)
        gaps = [b - a for (a, _), (b, size) in itertools.pairwise(arrivals) if size == 1]
        return arrivals[0][0] - began, gaps, count

    async def all_calls() -> list[tuple[float, list[float], int]]:
        async with grpc.aio.insecure_channel(target(server)) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            await stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)  # the connection is up before the clock starts
            return list(await asyncio.gather(*(one(stub, index) for index in range(100))))

    results = await trio.to_thread.run_sync(asyncio.run, all_calls())
    assert len(results) == 100
    assert all(count == tokens for _, _, count in results), sorted(count for _, _, count in results)
    # The client sees each first token no earlier than TTFT (later by its own overhead:
    # 100 grpc.aio calls in one Python thread), and the engine recorded about TTFT.
    firsts = sorted(first for first, _, _ in results)
    assert firsts[0] >= ttft * 0.95, firsts
    engine_ttft = await metric(server, "vllm:time_to_first_token_seconds_sum") / 100
    # (a token goes out at the step-grid time nearest its deadline: up to half of the
    # 2 ms grid early, llmsim/engine/grid.py)
    assert ttft - 0.001 <= engine_ttft <= ttft * 1.3, engine_ttft
    gap = statistics.median(g for _, gaps, _ in results for g in gaps)
    assert itl * 0.7 <= gap <= itl * 1.5, (gap, firsts[:3], firsts[-3:])


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_the_server_ends_a_call_past_its_grpc_timeout(nursery: trio.Nursery, backend: str) -> None:
    """A bare h2 client (no client-side deadline): the server's own ``grpc-timeout`` ends
    the call with DEADLINE_EXCEEDED in the trailers, after the messages sent so far."""
    server = await start(nursery, time_to_first_token=0.01, inter_token_latency=0.05, server=backend)
    stream = await trio.open_tcp_stream(server.host, server.port)
    client = H2Client(stream)
    await client.start()
    headers = ((b"content-type", b"application/grpc"), (b"te", b"trailers"), (b"grpc-timeout", b"200m"))
    body = frame(generate_request("slow", max_tokens=100).SerializeToString())
    sid = await client.request(f"/{'vllm.grpc.engine.VllmEngine'}/Generate", method="POST", body=body, headers=headers)
    with trio.fail_after(10):
        while not client.records[sid].done:
            await client.pump()
    record = client.records[sid]
    assert record.headers is not None and record.headers[b":status"] == b"200"
    assert dict(record.trailers)[b"grpc-status"] == b"4"
    messages = [pb.GenerateResponse.FromString(message) for message in unframe(record.body)]
    assert 0 < len(messages) < 10 and all(message.WhichOneof("response") == "chunk" for message in messages)
    await stream.aclose()


async def test_grpcio_sees_deadline_exceeded(nursery: trio.Nursery) -> None:
    server = await start(nursery, time_to_first_token=0.01, inter_token_latency=0.05)

    def call(stub: pb_grpc.VllmEngineStub) -> grpc.StatusCode:
        try:
            list(stub.Generate(generate_request("late", max_tokens=100), timeout=0.3))
        except grpc.RpcError as error:
            return error.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    assert await in_thread(server, call) == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_cancel_mid_stream_frees_the_slot(nursery: trio.Nursery) -> None:
    """One slot; a long stream cancelled after two chunks: the next call is admitted at
    once (else it would wait ~10 s for the first to finish)."""
    server = await start(nursery, time_to_first_token=0.01, inter_token_latency=0.05, max_num_seqs=1)

    def calls(stub: pb_grpc.VllmEngineStub) -> tuple[int, list[pb.GenerateResponse], int]:
        first = stub.Generate(generate_request("long", max_tokens=200), timeout=30)
        next(first), next(first)
        first.cancel()
        active = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).active_requests
        second = list(stub.Generate(generate_request("next", max_tokens=3), timeout=3))
        idle = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).active_requests
        return active, second, idle

    active, second, idle = await in_thread(server, calls)
    assert active <= 1  # the cancel may still be on its way
    assert second[-1].complete.finish_reason == "length"
    assert idle == 0


async def test_abort_ends_a_running_call_with_finish_reason_abort(nursery: trio.Nursery) -> None:
    server = await start(nursery, time_to_first_token=0.01, inter_token_latency=0.05)

    def calls(stub: pb_grpc.VllmEngineStub) -> list[pb.GenerateResponse]:
        running = stub.Generate(generate_request("victim", max_tokens=200), timeout=30)
        received = [next(running)]
        stub.Abort(pb.AbortRequest(request_ids=["victim", "unknown"]), timeout=5)
        return received + list(running)

    responses = await in_thread(server, calls)
    assert responses[-1].WhichOneof("response") == "complete"
    assert responses[-1].complete.finish_reason == "abort"
    assert len(responses) < 50


async def test_protocol_faults_reach_grpc_calls(nursery: trio.Nursery) -> None:
    """``x-llmsim-fault`` as call metadata: messages split over 3-byte DATA frames arrive
    whole; a stream reset after two messages is grpcio's CANCELLED, and frees the slot."""
    server = await start(nursery, time_to_first_token=0.01, inter_token_latency=0.01, max_num_seqs=1)

    def calls(stub: pb_grpc.VllmEngineStub) -> tuple[list[pb.GenerateResponse], list[pb.GenerateResponse], Any]:
        plain = list(stub.Generate(generate_request("f"), timeout=10))
        split = list(stub.Generate(generate_request("f"), metadata=(("x-llmsim-fault", "frame-size=3"),), timeout=10))
        try:
            list(stub.Generate(generate_request("r", max_tokens=500), metadata=(("x-llmsim-fault", "rst-after=2"),)))
        except grpc.RpcError as error:
            return plain, split, (error.code(), stub.GetServerInfo(pb.GetServerInfoRequest()).active_requests)
        return plain, split, None

    plain, split, reset = await in_thread(server, calls)
    assert split == plain and len(plain) == 6
    assert reset == (grpc.StatusCode.CANCELLED, 0)


async def test_http_and_grpc_share_the_port_at_once(nursery: trio.Nursery) -> None:
    server = await start(nursery, time_to_first_token=0.02, inter_token_latency=0.01)
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "stream": True,
        "ignore_eos": True,
    }
    results: dict[str, Any] = {}

    async def over_http(http2: bool) -> None:
        async with (
            httpx.AsyncClient(http1=not http2, http2=http2) as client,
            client.stream("POST", f"{server.url}/v1/chat/completions", json=chat) as response,
        ):
            results[f"http2={http2}"] = [line async for line in response.aiter_lines() if line]

    async def over_grpc() -> None:
        results["grpc"] = await in_thread(
            server, lambda stub: list(stub.Generate(generate_request("both", max_tokens=10), timeout=10))
        )

    async with trio.open_nursery() as calls:
        calls.start_soon(over_http, True)
        calls.start_soon(over_http, False)
        calls.start_soon(over_grpc)
    assert results["http2=True"][-1] == results["http2=False"][-1] == "data: [DONE]"
    assert results["grpc"][-1].complete.finish_reason == "length"
    # two chats and one gRPC call went through the one engine, 10 tokens each
    assert await metric(server, "vllm:request_generation_tokens_count") == 3
    assert await metric(server, "vllm:generation_tokens_total") == 30


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_health_check_model_info_server_info_and_loads(nursery: trio.Nursery, backend: str) -> None:
    server = await start(nursery, max_model_len=2048, server=backend)

    def calls(stub: pb_grpc.VllmEngineStub) -> tuple[Any, ...]:
        empty = (pb.HealthCheckRequest(), pb.GetModelInfoRequest(), pb.GetServerInfoRequest(), pb.GetLoadsRequest())
        return (
            stub.HealthCheck(empty[0], timeout=5),
            stub.GetModelInfo(empty[1], timeout=5),
            stub.GetServerInfo(empty[2], timeout=5),
            stub.GetLoads(empty[3], timeout=5),
            stub.Embed(pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=[5, 6])), timeout=5),
        )

    health, model, info, loads, embedded = await in_thread(server, calls)
    assert health.healthy and health.message == "Health"
    assert model.served_model_name == MODEL and model.max_context_length == 2048 and model.is_generation
    assert model.vocab_size > 0 and len(model.eos_token_ids) == 1
    assert info.server_type == "vllm-grpc" and info.active_requests == 0 and info.max_num_seqs > 0
    assert loads.dp_rank_count == 1 and loads.loads[0].num_running_reqs == 0
    assert embedded.prompt_tokens == 2 and embedded.embedding_dim == len(embedded.embedding) > 0


async def test_the_grpcio_health_client_sees_serving(nursery: trio.Nursery) -> None:
    server = await start(nursery)

    def run() -> list[Any]:
        with grpc.insecure_channel(target(server)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            answers: list[Any] = [
                stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
                for name in ("", "vllm.grpc.engine.VllmEngine")
            ]
            try:
                stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
            except grpc.RpcError as error:
                answers.append(error.code())
            answers.append([reply.status for reply in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)])
            return answers

    serving = health_pb2.HealthCheckResponse.SERVING
    assert await trio.to_thread.run_sync(run) == [serving, serving, grpc.StatusCode.NOT_FOUND, [serving]]


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/vllm.grpc.engine.VllmEngine/FlushCache", grpc.StatusCode.UNIMPLEMENTED),
        ("/vllm.grpc.engine.VllmEngine/NoSuchMethod", grpc.StatusCode.UNIMPLEMENTED),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", grpc.StatusCode.UNIMPLEMENTED),
    ],
)
async def test_methods_not_served_are_unimplemented(nursery: trio.Nursery, path: str, code: grpc.StatusCode) -> None:
    server = await start(nursery)

    def call(stub: pb_grpc.VllmEngineStub) -> grpc.StatusCode:
        with grpc.insecure_channel(target(server)) as channel:
            method = channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
            try:
                method(b"", timeout=5)
            except grpc.RpcError as error:
                return error.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    assert await in_thread(server, call) == code


@pytest.mark.parametrize(
    ("metadata", "request_changes", "code"),
    [
        ((("x-return-error", "429"),), {}, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ((("x-return-error", "503"),), {}, grpc.StatusCode.UNAVAILABLE),
        ((), {"max_tokens": 5000}, grpc.StatusCode.OK),  # the cap is clamped to the context window
        ((), {"input_ids": [2**32 - 1]}, grpc.StatusCode.INVALID_ARGUMENT),  # beyond the vocabulary
        ((), {"input_ids": []}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_errors_end_the_call_with_llm_d_s_status_codes(
    nursery: trio.Nursery, metadata: tuple[tuple[str, str], ...], request_changes: dict[str, Any], code: grpc.StatusCode
) -> None:
    server = await start(nursery, max_model_len=64)
    request = generate_request("e", max_tokens=request_changes.get("max_tokens", 3))
    if "input_ids" in request_changes:
        del request.tokenized.input_ids[:]
        request.tokenized.input_ids.extend(request_changes["input_ids"])

    def call(stub: pb_grpc.VllmEngineStub) -> grpc.StatusCode:
        try:
            list(stub.Generate(request, metadata=metadata, timeout=10))
        except grpc.RpcError as error:
            return error.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    assert await in_thread(server, call) == code
