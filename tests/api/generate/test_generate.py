"""POST /inference/v1/generate through the real router, engine and text generator, on
trio's mock clock: vLLM's token-in/token-out shapes (vllm/entrypoints/scale_out/
token_in_token_out/serving.py, protocol.py), llm-d-inference-sim's P/D answers, and
render -> generate giving what chat gives."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import trio
from trio.testing import MockClock

from llmsim.api.generate.render import GenerateShape, GenerateStreamRenderer
from llmsim.api.usage import UsageStyle
from llmsim.engine.job import Job, JobState
from llmsim.testing import open_simulator
from tests.api.fakes import CREATED, post, running, sse_payloads
from tests.api.test_transfer import PLACEHOLDER

PATH = "/inference/v1/generate"
LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]
RID = ((b"x-request-id", b"g1"),)


def generate(**fields: Any) -> dict[str, Any]:
    return {"token_ids": [11, 12, 13], "sampling_params": {"max_tokens": 4}, **fields}


def tokens_choice(index: int, finish: str | None, token_ids: list[int], **extra: Any) -> dict[str, Any]:
    """A ``GenerateTokensChoice`` / ``GenerateTokensStreamChoice`` dumped (protocol.py:463-540)."""
    return {
        "index": index,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": token_ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
        **extra,
        "logprobs": None,
    }


async def test_non_streaming_body_is_vllms_generate_tokens_response(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, generate(sampling_params={"max_tokens": 4, "ignore_eos": True}), RID)
    assert response.status == 200
    assert response.headers[b"x-request-id"] == b"g1"
    ids = response.json()["choices"][0]["token_ids"]
    assert len(ids) == 4
    # model_dump() whole, fields in declaration order (protocol.py:606-660; api_router.py:66-67)
    assert response.body == orjson.dumps(
        {
            "request_id": "generate-tokens-g1",  # serving.py:202-204
            "model": "llmsim/sim-model",
            "created": CREATED,
            "usage": {
                "prompt_tokens": 3,
                "total_tokens": 7,
                "completion_tokens": 4,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": "tokens",
            "choices": [tokens_choice(0, "length", ids)],
        }
    )


async def test_stream_chunks_carry_each_steps_token_ids(autojump_clock: MockClock) -> None:
    body = generate(
        sampling_params={"max_tokens": 3, "ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True},
    )
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        streamed = await post(sim, PATH, body, RID)
        whole = await post(sim, PATH, {**body, "stream": False, "stream_options": None}, RID)
    assert streamed.status == 200
    assert streamed.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert [when - started for when, _ in streamed.writes] == pytest.approx([0.1, 0.11, 0.12])
    ids = whole.json()["choices"][0]["token_ids"]
    head = b'data: {"request_id":"generate-tokens-g1","usage":null,"output_mode":"tokens","choices":['
    # one chunk per step, the finish reason on the last token's (serving.py:660-771); the
    # usage chunk dumped exclude_none (:785-808); then [DONE] (:820)
    expected = b"".join(
        head + orjson.dumps(tokens_choice(0, "length" if k == 2 else None, [ids[k]])) + b"]}\n\n" for k in range(3)
    )
    expected += (
        b'data: {"request_id":"generate-tokens-g1","usage":{"prompt_tokens":3,"total_tokens":6,'
        b'"completion_tokens":3},"output_mode":"tokens","choices":[]}\n\ndata: [DONE]\n\n'
    )
    assert streamed.body == expected


@pytest.mark.parametrize("text_mode", [False, True])
@pytest.mark.parametrize("finished", [False, True])
def test_plain_chunks_from_templates_equal_the_dumped_chunk(text_mode: bool, finished: bool) -> None:
    """The per-token chunk is built from byte templates; it must be the dict path's bytes."""
    job = Job(
        prompt_token_ids=(1, 2),
        output=("Hi", ' "there"\n', ""),
        finish_reason="stop",
        sink=_NoSink(),
        output_token_ids=(7, 8, 9),
        index=1,
    )
    job.state = JobState.FINISHED if finished else JobState.DECODING
    shape = GenerateShape(
        request_id='generate-tokens-"q"',
        text_mode=text_mode,
        stop_reasons=[None, "x"],
        usage_style=UsageStyle(prompt_details=False, created_cache_tokens=False),
    )
    renderer = GenerateStreamRenderer(shape, include_usage=False, continuous_usage=False)
    chunk = {
        "request_id": shape.request_id,
        "usage": None,
        "output_mode": shape.output_mode,
        "choices": [shape.choice(job, 0, 3, "stop" if finished else None)],
    }
    assert renderer.render(job, 0, 3) == b"data: " + orjson.dumps(chunk) + b"\n\n"


class _NoSink:
    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        return True


async def test_continuous_usage_and_return_token_ids(autojump_clock: MockClock) -> None:
    body = generate(
        sampling_params={"max_tokens": 2, "ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        return_token_ids=True,
        features={
            "mm_hashes": {"image": ["sim_img_0_1"]},
            "mm_placeholders": {"image": [{"offset": 1, "length": 2}]},
        },
    )
    async with running(**LATENCY) as sim:  # one token per step
        chunks = sse_payloads((await post(sim, PATH, body)).body)
        whole = (await post(sim, PATH, {**body, "stream": False, "stream_options": None})).json()
    first, second, usage, done = chunks
    # the first chunk carries the prompt and its ranges (serving.py:754-757), then never again
    assert list(first) == ["request_id", "usage", "prompt_token_ids", "mm_placeholders", "output_mode", "choices"]
    assert first["prompt_token_ids"] == [11, 12, 13]
    assert first["mm_placeholders"] == {"image": [{"offset": 1, "length": 2}]}
    assert list(second) == ["request_id", "usage", "output_mode", "choices"]
    assert [c["usage"]["completion_tokens"] for c in (first, second)] == [1, 2]
    assert second["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert usage["choices"] == [] and done == "[DONE]"
    assert whole["prompt_token_ids"] == [11, 12, 13]
    assert whole["mm_placeholders"] == {"image": [{"offset": 1, "length": 2}]}


async def test_text_mode_adds_the_text_of_each_choice(autojump_clock: MockClock) -> None:
    async with running() as sim:
        body = (await post(sim, PATH, generate(output_mode="text", sampling_params={"n": 2, "max_tokens": 6}))).json()
        tokenizer = sim.ctx.tokenizer
    assert body["output_mode"] == "text"
    for index, choice in enumerate(body["choices"]):
        assert choice["index"] == index
        assert list(choice)[-2:] == ["text", "logprobs"]  # GenerateTextChoice (protocol.py:490-498)
        ids = choice["token_ids"]
        text_ids = ids[:-1] if choice["finish_reason"] == "stop" else ids  # the EOS adds no text
        assert choice["text"] == tokenizer.decode(text_ids)


@pytest.mark.parametrize("stream", [False, True])
async def test_render_then_generate_gives_the_tokens_chat_gives(autojump_clock: MockClock, stream: bool) -> None:
    chat = {"model": "llmsim/sim-model", "messages": HELLO, "stream": stream}
    header = ((b"x-request-id", b"same"),)
    async with running() as sim:
        rendered = await post(sim, "/v1/chat/completions/render", chat, header)
        generated = await post(sim, PATH, {**rendered.json(), "output_mode": "text"}, header)
        answered = await post(sim, "/v1/chat/completions", chat, header)
        tokenizer, eos = sim.ctx.tokenizer, sim.ctx.text.eos
    if stream:
        chunks = [c for c in sse_payloads(generated.body)[:-1] if c["choices"]]
        ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"]
        chat_chunks = [c for c in sse_payloads(answered.body)[:-1] if c["choices"]]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chat_chunks)
        chat_finish = chat_chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = generated.json()["choices"][0]
        ids, text, finish = choice["token_ids"], choice["text"], choice["finish_reason"]
        content = answered.json()["choices"][0]["message"]["content"]
        chat_finish = answered.json()["choices"][0]["finish_reason"]
        assert generated.json()["usage"]["completion_tokens"] == answered.json()["usage"]["completion_tokens"]
        assert generated.json()["usage"]["prompt_tokens"] == answered.json()["usage"]["prompt_tokens"]
    assert len(content) > 20
    assert (text, finish) == (content, chat_finish)
    assert ids[-1] == eos.token_id and finish == "stop"
    assert tokenizer.decode(ids[:-1]) == content


async def test_logprobs_in_tokens_and_text_mode(autojump_clock: MockClock) -> None:
    params = {"max_tokens": 3, "ignore_eos": True, "logprobs": 2}
    async with running(**LATENCY) as sim:
        tokens = (await post(sim, PATH, generate(sampling_params=params), RID)).json()
        streamed = sse_payloads((await post(sim, PATH, generate(sampling_params=params, stream=True), RID)).body)
        text = (await post(sim, PATH, generate(sampling_params=params, output_mode="text"), RID)).json()
        tokenizer = sim.ctx.tokenizer
    choice = tokens["choices"][0]
    content = choice["logprobs"]["content"]
    # GenerateLogProbsContent: token_id, logprob, rank, top_logprobs (protocol.py:431-460); the
    # sampled token first, ranked 1, the engine's candidates uncut (serving.py:876-922)
    assert [entry["token_id"] for entry in content] == choice["token_ids"]
    for entry in content:
        assert list(entry) == ["token_id", "logprob", "rank", "top_logprobs"]
        assert entry["rank"] == 1
        top = entry["top_logprobs"]
        assert [t["rank"] for t in top] == [1, 2]
        assert top[0] == {"token_id": entry["token_id"], "logprob": entry["logprob"], "rank": 1}
        assert top[1]["logprob"] < top[0]["logprob"]
    # a stream's chunks carry the same numbers, token by token
    chunks = [c for c in streamed[:-1] if c["choices"]]
    assert [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]] == content
    # text mode: chat's shape, each token decoded from its id (serving.py:832-874)
    text_content = text["choices"][0]["logprobs"]["content"]
    for token_id, entry in zip(text["choices"][0]["token_ids"], text_content, strict=True):
        assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
        assert entry["token"] == tokenizer.decode([token_id])
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2


async def test_too_many_logprobs_are_refused_in_band_on_a_stream(autojump_clock: MockClock) -> None:
    params = {"max_tokens": 3, "logprobs": 21}
    async with running() as sim:
        whole = await post(sim, PATH, generate(sampling_params=params))
        streamed = await post(sim, PATH, generate(sampling_params=params, stream=True))
    message = "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)"
    assert whole.status == 400
    assert whole.json()["error"]["message"] == message
    # SamplingParams.verify runs as the engine takes the request, after the stream began;
    # the error is json.dumps'd (vllm/entrypoints/generate/base/serving.py:183-198)
    assert streamed.status == 200
    assert streamed.body == (
        b'data: {"error": {"message": "' + message.encode() + b'", "type": "BadRequestError", '
        b'"param": "logprobs", "code": 400}}\n\ndata: [DONE]\n\n'
    )


async def test_a_rendered_multimodal_prompt_generates_with_its_features(autojump_clock: MockClock) -> None:
    content = [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "and"},
        {"type": "video_url", "video_url": {"url": "https://example.com/b.mp4"}},
    ]
    async with running() as sim:
        rendered = (
            await post(sim, "/v1/chat/completions/render", {"messages": [{"role": "user", "content": content}]})
        ).json()
        generated = await post(sim, PATH, {**rendered, "return_token_ids": True})
    assert generated.status == 200
    body = generated.json()
    assert body["prompt_token_ids"] == rendered["token_ids"]
    assert body["mm_placeholders"] == rendered["features"]["mm_placeholders"]
    assert set(body["mm_placeholders"]) == {"image", "video"}


async def test_stop_token_ids_end_the_turn_with_their_stop_reason(autojump_clock: MockClock) -> None:
    async with running() as sim:
        first = (await post(sim, PATH, generate(sampling_params={"max_tokens": 20, "ignore_eos": True}), RID)).json()
        third = first["choices"][0]["token_ids"][2]
        params = {"max_tokens": 20, "ignore_eos": True, "stop_token_ids": [third]}
        stopped = (await post(sim, PATH, generate(sampling_params=params), RID)).json()
    choice = stopped["choices"][0]
    assert choice["token_ids"] == first["choices"][0]["token_ids"][:3]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", third)


async def test_absent_max_tokens_is_the_room_the_prompt_leaves(autojump_clock: MockClock) -> None:
    async with running(max_model_len=20) as sim:
        body = (
            await post(sim, PATH, {"token_ids": list(range(300, 315)), "sampling_params": {"ignore_eos": True}})
        ).json()
    # serving.py:348-361: not SamplingParams' default of 16
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


async def test_do_remote_decode_answers_as_llm_ds_prefill_pod(autojump_clock: MockClock) -> None:
    kv = {"do_remote_decode": True, "do_remote_prefill": False}
    async with running() as sim:
        at_root = (await post(sim, PATH, generate(kv_transfer_params=kv))).json()
        # llm-d also reads it from sampling_params.extra_args (generate.go:33-41)
        nested = generate(sampling_params={"max_tokens": 1, "extra_args": {"kv_transfer_params": kv}})
        in_extra = (await post(sim, PATH, nested)).json()
        streamed = await post(sim, PATH, generate(kv_transfer_params=kv, stream=True))
        decode_side = (await post(sim, PATH, generate(kv_transfer_params={"do_remote_prefill": True}))).json()
    for body in (at_root, in_extra):
        assert body["choices"][0]["finish_reason"] == "remote_decode"
        assert body["kv_transfer_params"] == PLACEHOLDER
    assert streamed.status == 400
    assert streamed.json()["error"]["message"] == "Prefill does not support streaming"  # helpers.go:76-79
    assert decode_side["kv_transfer_params"] is None
    assert decode_side["choices"][0]["finish_reason"] in ("stop", "length")


async def test_do_remote_prefill_waits_the_kv_transfer_instead_of_the_ttft(autojump_clock: MockClock) -> None:
    config = {**LATENCY, "kv_cache_transfer_latency": 0.5}
    body = generate(sampling_params={"max_tokens": 1, "ignore_eos": True}, stream=True)
    async with running(**config) as sim:
        started = trio.current_time()
        local = await post(sim, PATH, body)
        local_first = local.writes[0][0] - started
        started = trio.current_time()
        remote = await post(sim, PATH, {**body, "kv_transfer_params": {"do_remote_prefill": True}})
        remote_first = remote.writes[0][0] - started
    # llm-d's decode pod: TTFT replaced by the KV-cache transfer latency (latencies.go)
    assert (local_first, remote_first) == pytest.approx((0.1, 0.5))


def _error(**overrides: Any) -> dict[str, Any]:
    return {**generate(), **overrides}


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"sampling_params": {}}, 400, "body.token_ids"),
        ({"token_ids": [1, 2]}, 400, "body.sampling_params"),
        (_error(token_ids="1 2 3"), 400, "body.token_ids"),
        (_error(token_ids=[1, "x"]), 400, "body.token_ids.1"),
        (_error(token_ids=[]), 400, "List should have at least 1 item"),
        (_error(token_ids=[4, -1]), 400, "token_ids must not contain negative values"),
        (_error(token_ids=[4, 2**31]), 400, "Token id 2147483648 is out of vocabulary"),
        (_error(token_ids=list(range(300, 400))), 400, "maximum context length is 64 tokens"),
        (_error(sampling_params=[4]), 400, "body.sampling_params"),
        (_error(sampling_params={"max_tokens": "many"}), 400, "body.sampling_params.max_tokens"),
        (_error(sampling_params={"max_tokens": 0}), 400, "max_tokens must be at least 1"),
        (_error(sampling_params={"temperature": 5}), 400, "temperature must be in [0, 2]"),
        (_error(sampling_params={"logprobs": -3}), 400, "logprobs must be non-negative or -1"),
        (_error(sampling_params={"n": 200}), 400, "sampling_params.n must be at most the server's max_num_seqs"),
        (_error(sampling_params={"min_tokens": 9, "max_tokens": 4}), 400, "min_tokens must be less than"),
        (_error(kv_transfer_params="yes"), 400, "Input should be a valid dictionary"),
        (_error(output_mode="derender"), 400, "output_mode"),
        (_error(output_mode="text", sampling_params={"detokenize": False}), 400, "detokenize"),
        (_error(model="other"), 404, "does not exist"),
        (_error(features={"mm_hashes": {"image": ["h"]}}), 400, "body.features.mm_placeholders"),
        (
            _error(
                features={"mm_hashes": {"image": ["h"]}, "mm_placeholders": {"audio": [{"offset": 0, "length": 1}]}}
            ),
            400,
            "must use the same modalities",
        ),
        (
            _error(
                features={"mm_hashes": {"image": ["h"]}, "mm_placeholders": {"image": [{"offset": 2, "length": 5}]}}
            ),
            400,
            "must remain within the token_ids sequence",
        ),
        (
            _error(
                features={
                    "mm_hashes": {"image": ["h", "i"]},
                    "mm_placeholders": {"image": [{"offset": 0, "length": 2}, {"offset": 1, "length": 1}]},
                }
            ),
            400,
            "globally non-overlapping",
        ),
    ],
)
async def test_bad_generate_requests_get_a_4xx_envelope(
    autojump_clock: MockClock, body: dict[str, Any], status: int, fragment: str
) -> None:
    async with running(max_model_len=64, max_num_seqs=8) as sim:
        response = await post(sim, PATH, body)
        after = await post(sim, PATH, generate())
    assert response.status == status, response.body
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert fragment in error["message"] or fragment == error["param"]
    assert after.status == 200  # and the server keeps serving


#: Values of every JSON type, and the edges of the ones that are right.
ODD_VALUES = [None, 1, -1, 2**40, 1.5, "x", "", [], [1], [-1], ["a"], {}, {"a": 1}, [[1]], True]


async def test_no_body_shape_gets_a_5xx(autojump_clock: MockClock) -> None:
    """Every field of the body, and of sampling_params and features, set to each odd value."""
    fields = ["token_ids", "sampling_params", "features", "stream", "stream_options", "kv_transfer_params"]
    fields += ["return_token_ids", "output_mode", "request_id", "model", "content_parts", "priority"]
    nested = {
        "sampling_params": ["max_tokens", "n", "stop", "stop_token_ids", "extra_args", "temperature", "logit_bias"],
        "features": ["mm_hashes", "mm_placeholders", "kwargs_data"],
    }
    features = {"mm_hashes": {"image": ["h"]}, "mm_placeholders": {"image": [{"offset": 0, "length": 1}]}}
    bodies: list[object] = [b"", b"[]", b"null", b"{", b'"x"']
    bodies += [_error(**{field: value}) for field in fields for value in ODD_VALUES]
    for field, keys in nested.items():
        base = features if field == "features" else {"max_tokens": 2}
        bodies += [_error(**{field: {**base, key: value}}) for key in keys for value in ODD_VALUES]
    statuses = set()
    async with running() as sim:
        for body in bodies:
            response = await post(sim, PATH, body)
            statuses.add(response.status)
            assert response.status < 500, (body, response.body)
    assert statuses >= {200, 400}


@pytest.mark.parametrize("http_version", ["http1", "http2"])
async def test_render_and_generate_over_a_real_server(http_version: str) -> None:
    """The same flow over sockets (HTTP/2 with prior knowledge), the render answer posted
    back as it came; /v1/responses/render is routed as a path of its own."""
    headers = {"x-request-id": "wire"}
    chat = {"messages": HELLO, "max_tokens": 12, "ignore_eos": True}
    async with open_simulator(seed=5) as server:
        http2 = http_version == "http2"
        async with httpx.AsyncClient(base_url=server.url, http1=not http2, http2=http2, timeout=10) as client:
            rendered = await client.post("/v1/chat/completions/render", json=chat, headers=headers)
            body = {**rendered.json(), "stream": True, "output_mode": "text"}
            generated = await client.post(PATH, json=body, headers=headers)
            answered = await client.post("/v1/chat/completions", json=chat, headers=headers)
            responses_render = await client.post("/v1/responses/render", json={"input": "Hi"})
    assert generated.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    chunks = [c for c in sse_payloads(generated.content)[:-1] if c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == answered.json()["choices"][0]["message"]["content"]
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 12
    assert responses_render.status_code == 200
