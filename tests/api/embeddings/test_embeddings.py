"""POST /v1/embeddings: vLLM 0.33's shapes and errors through the real router (no server,
no sockets), then the openai SDK over real HTTP/1.1 and HTTP/2."""

from __future__ import annotations

import base64
import json
import math
import struct
from array import array
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.model.embeddings import embedding
from llmsim.model.tokenizer import SimTokenizer
from llmsim.server import ServerHandle
from llmsim.testing import open_simulator
from tests.api.fakes import CREATED, FakeResponse, post, running

PATH = "/v1/embeddings"
MODEL = "sim-embed"
SIZE = 384  # --default-embedding-dimensions' default


async def embed(body: object, headers: tuple[tuple[bytes, bytes], ...] = (), **config: Any) -> FakeResponse:
    async with running(served_model_name=(MODEL,), **config) as sim:
        return await post(sim, PATH, body, headers)


def floats32(data: bytes, little: bool = True) -> list[float]:
    return list(struct.unpack(f"{'<' if little else '>'}{len(data) // 4}f", data))


def error_of(response: FakeResponse, status: int = 400) -> dict[str, Any]:
    """The error of a refused request, in vLLM's envelope."""
    assert response.status == status, response.body
    assert response.headers[b"content-type"] == b"application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status
    return dict(body["error"])


# --- the response -------------------------------------------------------------------------


async def test_the_float_response_byte_for_byte() -> None:
    """``EmbeddingResponse`` (vllm/entrypoints/pooling/embed/protocol.py:174-186) dumped as
    orjson dumps it (serve/utils/api_utils.py:26-50): id ``embd-<request id>``
    (base/serving.py:112-115), the served model name, items ``index, object, embedding``
    and ``UsageInfo`` whole (pooling/utils.py:147-157, serve/engine/protocol.py:135-140)."""
    response = await embed({"model": MODEL, "input": [5, 6, 7], "dimensions": 4}, ((b"x-request-id", b"abc"),))
    assert response.status == 200
    assert response.headers[b"content-type"] == b"application/json"
    assert response.headers[b"x-request-id"] == b"abc"
    vector = embedding([5, 6, 7], 4)
    expected = (
        b'{"id":"embd-abc","object":"list","created":%d,"model":"sim-embed","data":[{"index":0,"object":"embedding",'
        b'"embedding":%s}],"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0,'
        b'"prompt_tokens_details":null,"completion_tokens_details":null}}'
    ) % (CREATED, orjson.dumps(vector))
    assert response.body == expected
    assert response.headers[b"content-length"] == str(len(expected)).encode()


async def test_the_base64_response_is_little_endian_float32_of_the_same_vector() -> None:
    """``encoding_format: base64``: float32 bytes, the server's native order (little on
    every GPU host), base64 (pooling/utils.py:86-92); what the openai SDK asks for."""
    floats = (await embed({"input": "Hello there, world"})).json()
    encoded = (await embed({"input": "Hello there, world", "encoding_format": "base64"})).json()
    assert {k: v for k, v in encoded.items() if k not in ("id", "data")} == {
        k: v for k, v in floats.items() if k not in ("id", "data")
    }
    text = encoded["data"][0]["embedding"]
    assert isinstance(text, str)
    decoded = floats32(base64.b64decode(text))
    assert decoded == array("f", floats["data"][0]["embedding"]).tolist()
    assert len(decoded) == SIZE


@pytest.mark.parametrize(
    ("value", "prompt_tokens"),
    [
        ("The quick brown fox", [4]),
        (["first text", "a second, longer text"], [2, 5]),
        ([11, 12, 13], [3]),
        ([[1, 2], [3, 4, 5, 6], [7]], [2, 4, 1]),
    ],
)
async def test_the_four_input_forms(value: Any, prompt_tokens: list[int]) -> None:
    """``input: list[int] | list[list[int]] | str | list[str]`` (base/protocol.py:214), one
    prompt per string or per token-id array (renderers/inputs/preprocess.py:46-54)."""
    body = (await embed({"input": value, "dimensions": 8})).json()
    assert [item["index"] for item in body["data"]] == list(range(len(prompt_tokens)))
    assert all(item["object"] == "embedding" and len(item["embedding"]) == 8 for item in body["data"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == sum(prompt_tokens)
    prompts = [value] if isinstance(value, str) or isinstance(value[0], int) else value
    tokenizer = SimTokenizer()
    for item, prompt in zip(body["data"], prompts, strict=True):
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        assert item["embedding"] == embedding(ids, 8)


async def test_the_same_input_gives_the_same_vector_whatever_the_seed() -> None:
    first = (await embed({"input": "same words"}, seed=1)).json()
    second = (await embed({"input": "same words"}, seed=2)).json()
    other = (await embed({"input": "other words"}, seed=1)).json()
    assert first["data"] == second["data"]
    assert first["data"] != other["data"]
    assert math.sqrt(sum(v * v for v in first["data"][0]["embedding"])) == pytest.approx(1.0, abs=1e-5)


async def test_dimensions_truncate_then_normalise_and_the_flag_sets_the_size() -> None:
    """Matryoshka: the first ``dimensions`` components, normalised again
    (model_executor/layers/pooler/seqwise/heads.py:85-112)."""
    full = (await embed({"input": [9, 99, 999], "use_activation": False})).json()["data"][0]["embedding"]
    short = (await embed({"input": [9, 99, 999], "dimensions": "5"})).json()["data"][0]["embedding"]
    norm = math.sqrt(sum(v * v for v in full[:5]))
    assert short == pytest.approx([v / norm for v in full[:5]], abs=1e-5)
    sized = (await embed({"input": "x"}, default_embedding_dimensions=16)).json()
    assert len(sized["data"][0]["embedding"]) == 16


async def test_use_activation_false_gives_llm_d_inference_sims_raw_vector() -> None:
    body = (await embed({"input": [[1024, 513]], "dimensions": 4, "use_activation": False})).json()
    # 2*(t%1024)/1024-1 for the ids, then 2*(t%256)/256-1 cycling (pkg/common/utils.go:229-243)
    assert body["data"][0]["embedding"] == [-1.0, 0.001953125, -1.0, -0.9921875]


async def test_an_unknown_model_name_is_served_under_the_served_name() -> None:
    """vLLM's pooling ``_check_model`` refuses no name (base/serving.py:219-239) and the
    response names the served model (:120)."""
    body = (await embed({"model": "whatever", "input": "hi", "user": "u-1"})).json()
    assert body["model"] == MODEL


async def test_request_id_names_the_response() -> None:
    body = (await embed({"input": "hi", "request_id": "mine"})).json()
    assert body["id"] == "embd-mine"


async def test_truncate_prompt_tokens_keeps_the_first_tokens_or_the_last() -> None:
    """``truncate_prompt_tokens`` and ``truncation_side`` (vllm/renderers/params.py:497-529;
    -1 is the whole context window for pooling, :238-257)."""
    ids = [1, 2, 3, 4, 5, 6]
    first = (await embed({"input": ids, "truncate_prompt_tokens": 2, "dimensions": 6})).json()
    last = (await embed({"input": ids, "truncate_prompt_tokens": 2, "truncation_side": "left", "dimensions": 6})).json()
    window = (await embed({"input": ids, "truncate_prompt_tokens": -1, "dimensions": 6}, max_model_len=4)).json()
    assert first["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"] == 2
    assert first["data"][0]["embedding"] == embedding([1, 2], 6)
    assert last["data"][0]["embedding"] == embedding([5, 6], 6)
    assert window["data"][0]["embedding"] == embedding([1, 2, 3, 4], 6)


async def test_bytes_format_sends_the_packed_vectors_and_their_metadata() -> None:
    """``encoding_format: bytes``: the vectors back to back, and a ``metadata`` header of
    Python's json.dumps; ``bytes_only`` without it (vllm/entrypoints/pooling/utils.py:95-125, 170-205)."""
    body = {"input": [[1, 2], [3]], "dimensions": 3, "encoding_format": "bytes", "endianness": "big"}
    response = await embed(body, ((b"x-request-id", b"r1"),))
    assert response.status == 200
    assert response.headers[b"content-type"] == b"application/octet-stream"
    metadata = json.loads(response.headers[b"metadata"])
    assert metadata == {
        "id": "embd-r1",
        "created": CREATED,
        "model": MODEL,
        "data": [
            {"index": 0, "embed_dtype": "float32", "endianness": "big", "start": 0, "end": 12, "shape": [3]},
            {"index": 1, "embed_dtype": "float32", "endianness": "big", "start": 12, "end": 24, "shape": [3]},
        ],
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    assert floats32(response.body[:12], little=False) == array("f", embedding([1, 2], 3)).tolist()
    only = await embed({**body, "encoding_format": "bytes_only", "embed_dtype": "float16"})
    assert b"metadata" not in only.headers
    assert len(only.body) == 2 * 3 * 2


# --- bad input: a 4xx in the envelope, never a 500 -----------------------------------------


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        # base/serving.py:87-88 (a ValueError: no param)
        ({"input": []}, "You must pass at least one prompt", None),
        # an empty prompt, as the engine takes it (v1/engine/input_processor.py:565-566)
        ({"input": ""}, "The decoder prompt cannot be empty", None),
        ({"input": ["ok", ""]}, "The decoder prompt cannot be empty", None),
        ({"input": [[1], []]}, "The decoder prompt cannot be empty", None),
        ({"input": "x", "truncate_prompt_tokens": 0}, "The decoder prompt cannot be empty", None),
        # renderers/base.py:453-490
        ({"input": [3, -1]}, "Token id -1 is out of vocabulary", None),
        ({"input": [[1], [2**31]]}, f"Token id {2**31} is out of vocabulary", None),
        # pooling_params.py:233-251, with the served name
        ({"input": "x", "dimensions": 0}, "Model 'sim-embed' only supports dimensions in range [1, 384], got 0.", None),
        (
            {"input": "x", "dimensions": 385},
            "Model 'sim-embed' only supports dimensions in range [1, 384], got 385.",
            None,
        ),
        (
            {"input": "x", "dimensions": 10**12},
            "Model 'sim-embed' only supports dimensions in range [1, 384], got 1000000000000.",
            None,
        ),
        # base/serving.py:241-252
        (
            {"input": "x", "truncate_prompt_tokens": 40000},
            "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
            None,
        ),
        ({"input": "x", "encoding_format": "base64", "embed_dtype": "fp8_e4m3"}, None, "embed_dtype"),
    ],
)
async def test_refused_values(body: dict[str, Any], message: str | None, param: str | None) -> None:
    error = error_of(await embed(body))
    assert error["type"] == "BadRequestError"
    assert error["param"] == param
    if message is not None:
        assert error["message"] == message


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("normalize", True, "Parameter `normalize` was removed; use `use_activation` instead."),
        ("task", "score", "`score` task was removed; use `classify` instead."),
    ],
)
async def test_removed_parameters(field: str, value: object, text: str) -> None:
    """``reject_removed_pooling_parameters`` (base/protocol.py:23-32, vllm/tasks.py:20-30) runs
    before the union is validated: pydantic's ``value_error`` on the body, with the
    exception's parameter as ``param`` (exception_handling/handlers/validation.py:158-165)."""
    error = error_of(await embed({"input": 5, field: value}))
    assert error["type"] == "Bad Request"
    assert error["param"] == field
    assert error["message"] == (
        "1 validation error:\n  {'type': 'value_error', 'loc': 'body', "
        f"'msg': 'Value error, {text} (parameter={field})', 'input': '<dict of 2 items>', "
        f"'ctx': {{'error': VLLMValidationError('{text}')}}}}"
    )


async def test_a_prompt_longer_than_the_context_window() -> None:
    """renderers/params.py:531-551 (token ids: their count)."""
    error = error_of(await embed({"input": list(range(10))}, max_model_len=8))
    assert error["message"] == (
        "This model's maximum context length is 8 tokens. However, your prompt contains 10 input tokens, "
        "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=10)"
    )
    assert error["param"] == "input_tokens"


@pytest.mark.parametrize(
    ("body", "param", "first_error"),
    [
        ({}, "body.input", {"type": "missing", "loc": "body.input", "msg": "Field required"}),
        ({"input": 5}, "body.input", {"type": "list_type", "loc": "body.input", "msg": "Input should be a valid list"}),
        (
            {"input": None},
            "body.input",
            {"type": "list_type", "loc": "body.input", "msg": "Input should be a valid list"},
        ),
        (
            {"input": {"text": "hi"}},
            "body.input",
            {"type": "list_type", "loc": "body.input", "msg": "Input should be a valid list"},
        ),
        (
            {"input": [1, "a"]},
            "body.input",
            {
                "type": "int_parsing",
                "loc": "body.input.1",
                "msg": "Input should be a valid integer, unable to parse string as an integer",
            },
        ),
        (
            {"input": [[1], "a"]},
            "body.input",
            {"type": "int_type", "loc": "body.input.0", "msg": "Input should be a valid integer"},
        ),
        (
            {"input": [1.5]},
            "body.input",
            {
                "type": "int_from_float",
                "loc": "body.input.0",
                "msg": "Input should be a valid integer, got a number with a fractional part",
            },
        ),
        (
            {"input": "x", "dimensions": "four"},
            "body.dimensions",
            {
                "type": "int_parsing",
                "loc": "body.dimensions",
                "msg": "Input should be a valid integer, unable to parse string as an integer",
            },
        ),
        (
            {"input": "x", "encoding_format": "xml"},
            "body.encoding_format",
            {
                "type": "literal_error",
                "loc": "body.encoding_format",
                "msg": "Input should be 'float', 'base64', 'bytes' or 'bytes_only'",
            },
        ),
        (
            {"input": "x", "embed_dtype": "int8"},
            "body.embed_dtype",
            {
                "type": "literal_error",
                "loc": "body.embed_dtype",
                "msg": "Input should be 'float32', 'float16', 'bfloat16', 'fp8_e4m3' or 'fp8_e5m2'",
            },
        ),
        (
            {"input": "x", "endianness": "middle"},
            "body.endianness",
            {"type": "literal_error", "loc": "body.endianness", "msg": "Input should be 'native', 'big' or 'little'"},
        ),
        (
            {"input": "x", "truncation_side": "up"},
            "body.truncation_side",
            {"type": "literal_error", "loc": "body.truncation_side", "msg": "Input should be 'left' or 'right'"},
        ),
        (
            {"input": "x", "truncate_prompt_tokens": -2},
            "body.truncate_prompt_tokens",
            {
                "type": "greater_than_equal",
                "loc": "body.truncate_prompt_tokens",
                "msg": "Input should be greater than or equal to -1",
            },
        ),
        (
            {"input": "x", "priority": 2**63},
            "body.priority",
            {
                "type": "less_than_equal",
                "loc": "body.priority",
                "msg": "Input should be less than or equal to 9223372036854775807",
            },
        ),
        (
            {"input": "x", "user": 5},
            "body.user",
            {"type": "string_type", "loc": "body.user", "msg": "Input should be a valid string"},
        ),
        (
            {"input": "x", "model": ["m"]},
            "body.model",
            {"type": "string_type", "loc": "body.model", "msg": "Input should be a valid string"},
        ),
        (
            {"input": "x", "use_activation": "maybe"},
            "body.use_activation",
            {
                "type": "bool_parsing",
                "loc": "body.use_activation",
                "msg": "Input should be a valid boolean, unable to interpret input",
            },
        ),
    ],
)
async def test_wrong_types_get_pydantics_errors(body: dict[str, Any], param: str, first_error: dict[str, str]) -> None:
    """FastAPI's validation errors as vLLM renders them (exception_handling/handlers/
    validation.py:149-196): type ``Bad Request``, ``param`` the first error's location,
    and the errors, with pydantic's per-branch errors for ``input``'s union."""
    error = error_of(await embed(body))
    assert error["type"] == "Bad Request"
    assert error["param"] == param
    first_line = error["message"].split("\n")[1].strip()
    for key, value in first_error.items():
        assert f"'{key}': {value!r}" in first_line, first_line


async def test_the_union_lists_every_branchs_error() -> None:
    error = error_of(await embed({"input": 5}))
    assert error["message"] == (
        "4 validation errors:\n"
        "  {'type': 'list_type', 'loc': 'body.input', 'msg': 'Input should be a valid list', 'input': '5'}\n"
        "  {'type': 'list_type', 'loc': 'body.input', 'msg': 'Input should be a valid list', 'input': '5'}\n"
        "  {'type': 'string_type', 'loc': 'body.input', 'msg': 'Input should be a valid string', 'input': '5'}\n"
        "  {'type': 'list_type', 'loc': 'body.input', 'msg': 'Input should be a valid list', 'input': '5'}"
    )


@pytest.mark.parametrize("raw", [b"", b"{not json", b"[1, 2]", b'"input"', b"null"])
async def test_a_body_that_is_not_a_json_object_then_the_server_keeps_serving(raw: bytes) -> None:
    async with running(served_model_name=(MODEL,)) as sim:
        error_of(await post(sim, PATH, raw))
        assert (await post(sim, PATH, {"input": "still here"})).status == 200


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    [
        "input",
        "dimensions",
        "encoding_format",
        "embed_dtype",
        "endianness",
        "truncate_prompt_tokens",
        "truncation_side",
        "use_activation",
        "model",
        "user",
        "request_id",
        "priority",
    ]
)


@given(body=st.dictionaries(FIELDS, JSON, max_size=4), tokens=st.lists(st.integers(-5, 2**32), max_size=5))
async def test_anything_gets_a_200_or_a_400_never_a_500(body: dict[str, Any], tokens: list[int]) -> None:
    for candidate in (body, {**body, "input": tokens}, {**body, "input": [tokens, tokens[:1]]}):
        response = await embed(json.dumps(candidate).encode(), max_model_len=4)  # orjson: no ints beyond 64 bits
        assert response.status in (200, 400), (candidate, response.body)
        if response.status == 400:
            error_of(response)


# --- the openai SDK over real HTTP --------------------------------------------------------


@pytest.fixture(params=["http1", "http2"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK against a real server, over HTTP/1.1 or HTTP/2 with prior knowledge."""
    async with open_simulator(served_model_name=(MODEL,)) as handle:
        assert isinstance(handle, ServerHandle)
        version = request.param
        async with httpx.AsyncClient(http1=version == "http1", http2=version == "http2") as http_client:
            yield openai.AsyncOpenAI(
                base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, http_client=http_client
            )


async def test_sdk_default_base64(client: openai.AsyncOpenAI, request: pytest.FixtureRequest) -> None:
    """The SDK asks for base64 unless told otherwise and decodes it as float32."""
    response = await client.embeddings.create(model=MODEL, input=["one text", "two texts here"])
    raw = await client.embeddings.with_raw_response.create(model=MODEL, input="one text")
    assert json.loads(raw.http_request.content)["encoding_format"] == "base64"
    expected_version = {"http1": "HTTP/1.1", "http2": "HTTP/2"}[request.node.callspec.params["client"]]
    assert raw.http_response.http_version == expected_version
    assert response.object == "list" and response.model == MODEL
    assert [item.index for item in response.data] == [0, 1]
    assert all(len(item.embedding) == SIZE for item in response.data)
    expected = embedding(SimTokenizer().encode("one text"), SIZE)
    assert response.data[0].embedding == array("f", expected).tolist()
    assert response.usage.prompt_tokens == response.usage.total_tokens == 5


async def test_sdk_float_with_dimensions_and_token_ids(client: openai.AsyncOpenAI) -> None:
    response = await client.embeddings.create(
        model=MODEL, input=[[1, 2, 3], [4]], encoding_format="float", dimensions=12, user="someone"
    )
    assert [item.embedding for item in response.data] == [embedding([1, 2, 3], 12), embedding([4], 12)]
    assert response.usage.prompt_tokens == 4


async def test_sdk_raises_bad_request_for_bad_input(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=MODEL, input="x", dimensions=0)
    assert caught.value.status_code == 400
    assert "only supports dimensions in range [1, 384], got 0." in caught.value.message
    # and the server is still serving
    assert len((await client.embeddings.create(model=MODEL, input="x")).data) == 1
