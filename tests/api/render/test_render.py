"""The render endpoints (/v1/chat/completions/render, /v1/completions/render,
/v1/responses/render, /v1/messages/render) through the real router, on trio's mock clock.

Their body is vLLM's ``GenerateRequest`` dumped whole (vllm/entrypoints/scale_out/
render/serving.py:116-390, token_in_token_out/protocol.py:221-360)."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from llmsim.api.chat.request import chat_prompt_ids, parse_chat_request
from llmsim.api.http import HttpRequest
from llmsim.api.render.features import fnv1a_32
from llmsim.api.render.gate import SCALE_OUT_DISABLED
from tests.api.fakes import FakeResponse, post, running

CHAT = "/v1/chat/completions/render"
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]
ROOM = 32768  # the default max_model_len

#: A plain request's ``sampling_params``: what ``__post_init__`` and ``to_sampling_params``
#: make differ from SamplingParams' defaults (vllm/sampling_params.py:559-620,
#: chat_completion/protocol.py:748-823), in field order.
PLAIN_SAMPLING = {
    "stop": [],
    "stop_token_ids": [],
    "output_kind": 2,
    "skip_clone": True,
    "bad_words": [],
    "skip_reading_prefix_cache": False,
}
#: A chat render's ``parse_context`` when the request has no tools (protocol.py:52-72;
#: build_chat_params, chat_completion/protocol.py:643-682).
PLAIN_CONTEXT = {
    "tools": None,
    "tool_choice": "none",
    "parallel_tool_calls": True,
    "include_reasoning": True,
    "chat_template_kwargs": {"add_generation_prompt": True, "continue_final_message": False},
    "history_tool_call_cnt": 0,
}


def generate_request(request_id: str, token_ids: list[int], sampling: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A ``GenerateRequest`` dumped with ``model_dump()``: every field, in order."""
    body: dict[str, Any] = {
        "request_id": request_id,
        "token_ids": token_ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling,
        "model": None,
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "parse_context": None,
        "stream": False,
        "stream_options": None,
        "cache_salt": None,
        "priority": 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }
    assert set(fields) <= set(body)
    body.update(fields)
    return body


async def test_chat_render_is_the_generate_request_vllm_answers(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, CHAT, {"model": "llmsim/sim-model", "messages": HELLO}, ((b"x-request-id", b"r1"),))
        ids = chat_prompt_ids(sim.ctx.tokenizer, parse_chat_request({"messages": HELLO}).messages)
    assert response.status == 200
    assert response.headers[b"content-type"] == b"application/json"
    sampling = {  # in SamplingParams' field order; max_tokens: the room left (api_utils.py:234-270)
        "stop": [],
        "stop_token_ids": [],
        "max_tokens": ROOM - len(ids),
        "output_kind": 2,
        "skip_clone": True,
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }
    expected = generate_request("chatcmpl-r1", ids, sampling, model="llmsim/sim-model", parse_context=PLAIN_CONTEXT)
    assert response.body == orjson.dumps(expected)


async def test_chat_render_sampling_params_hold_what_the_request_changed(autojump_clock: MockClock) -> None:
    request = {
        "messages": HELLO,
        "n": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": "xyz",
        "stop_token_ids": [5, 5, 6],
        "max_completion_tokens": 40,
        "min_tokens": 2,
        "logprobs": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": {"12": 300},
        "kv_transfer_params": {"do_remote_decode": True},
        "vllm_xargs": {"k": 1},
        "priority": 4,
        "cache_salt": "salt",
        "return_token_ids": True,
    }
    async with running() as sim:
        body = (await post(sim, CHAT, request)).json()
    assert body["sampling_params"] == {
        "n": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["xyz"],
        "stop_token_ids": [5, 6],  # deduplicated (sampling_params.py:583-586)
        "max_tokens": 40,
        "min_tokens": 2,
        "logprobs": 0,  # top_logprobs defaults to 0 (chat_completion/protocol.py:797-801)
        "output_kind": 1,  # DELTA on a stream
        "skip_clone": True,
        "output_text_buffer_length": 2,  # len("xyz") - 1 (sampling_params.py:591-593)
        "logit_bias": {"12": 100.0},  # clamped (sampling_params.py:491-503)
        "extra_args": {"k": 1},  # the transfer params hoisted out (render/serving.py:53-68)
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }
    assert list(body["sampling_params"]) == [  # SamplingParams' field order (sampling_params.py:285-440)
        "n",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stop_token_ids",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "output_kind",
        "skip_clone",
        "output_text_buffer_length",
        "logit_bias",
        "extra_args",
        "bad_words",
        "skip_reading_prefix_cache",
    ]
    assert body["kv_transfer_params"] == {"do_remote_decode": True}
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert (body["priority"], body["cache_salt"], body["return_token_ids"]) == (4, "salt", True)


async def test_chat_render_reports_synthetic_features_for_media_blocks(autojump_clock: MockClock) -> None:
    image, audio_data = "https://example.com/cat.png", base64.b64encode(b"RIFF....WAVE").decode()
    content = [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": image}},
        {"type": "input_audio", "input_audio": {"data": audio_data, "format": "wav"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
    ]
    async with running() as sim:
        body = (await post(sim, CHAT, {"messages": [{"role": "user", "content": content}]})).json()
        tokenizer = sim.ctx.tokenizer
    features = body["features"]
    assert list(features) == ["mm_hashes", "mm_placeholders", "kwargs_data", "mm_metadata"]
    # llm-d-inference-sim's names: sim_<img|audio|video>_<index in modality>_<fnv32a hex> (tokenizer.go:170-176)
    assert features["mm_hashes"] == {
        "image": [f"sim_img_0_{fnv1a_32(image):x}", f"sim_img_1_{fnv1a_32('data:image/png;base64,iVBORw0KGgo='):x}"],
        "audio": [f"sim_audio_0_{fnv1a_32(audio_data):x}"],
        "video": [f"sim_video_0_{fnv1a_32('https://example.com/v.mp4'):x}"],
    }
    assert features["kwargs_data"] == {
        modality: [base64.b64encode(h.encode()).decode() for h in hashes]
        for modality, hashes in features["mm_hashes"].items()
    }
    assert features["mm_metadata"] is None
    # each placeholder is exactly the tokens of its stand-in text in the prompt
    pieces = tokenizer.token_strings(body["token_ids"])
    seen = {}
    for modality, ranges in features["mm_placeholders"].items():
        seen[modality] = ["".join(pieces[r["offset"] : r["offset"] + r["length"]]).strip() for r in ranges]
    assert seen == {"image": ["<image>", "<image>"], "audio": ["<audio>"], "video": ["<video>"]}
    flat = sorted(
        (r["offset"], r["offset"] + r["length"]) for ranges in features["mm_placeholders"].values() for r in ranges
    )
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(flat))


def test_fnv1a_32_is_gos_new32a() -> None:
    # FNV-1a 32-bit reference values (the offset basis; "a"; "foobar")
    assert [fnv1a_32(s) for s in ("", "a", "foobar")] == [0x811C9DC5, 0xE40C292C, 0xBF9CF968]


async def test_text_only_chat_render_has_no_features(autojump_clock: MockClock) -> None:
    async with running() as sim:
        body = (await post(sim, CHAT, {"messages": HELLO})).json()
    assert body["features"] is None


async def test_completions_render_is_one_generate_request_per_prompt(autojump_clock: MockClock) -> None:
    request = {"model": "llmsim/sim-model", "prompt": [[5, 6, 7], [2**31 - 1]], "max_tokens": 8}
    async with running() as sim:
        response = await post(sim, "/v1/completions/render", request, ((b"x-request-id", b"c1"),))
        single = await post(sim, "/v1/completions/render", {"prompt": "Hello world"}, ((b"x-request-id", b"c2"),))
        hello = sim.ctx.tokenizer.encode("Hello world")
    sampling = {
        "stop": [],
        "stop_token_ids": [],
        "max_tokens": 8,
        "output_kind": 2,
        "skip_clone": True,
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }
    # token-id prompts pass as they are; ids cmpl-<id>-<i> (render/serving.py:290-333)
    assert response.body == orjson.dumps(
        [
            generate_request("cmpl-c1-0", [5, 6, 7], sampling, model="llmsim/sim-model"),
            generate_request("cmpl-c1-1", [2**31 - 1], sampling, model="llmsim/sim-model"),
        ]
    )
    # completions' max_tokens defaults to 16, SamplingParams' default: not written
    assert single.body == orjson.dumps([generate_request("cmpl-c2", hello, PLAIN_SAMPLING)])


async def test_responses_render_is_routed_to_render_not_to_a_stored_response(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, "/v1/responses/render", {"input": "Hello", "request_id": "resp_x"})
        refused = await post(sim, "/v1/responses/render", {"input": "Hello", "previous_response_id": "resp_1"})
    assert response.status == 200  # was 405: taken for /v1/responses/{response_id}
    body = response.json()
    assert body["request_id"] == "resp_x"
    # /v1/responses builds extra_args={} and the hoist leaves it (responses/protocol.py:622-648)
    assert body["sampling_params"]["extra_args"] == {}
    assert body["parse_context"] is None
    assert refused.status == 400
    assert refused.json()["error"] == {
        "message": "previous_response_id is not supported by the stateless render endpoint.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": 400,
    }


async def test_other_methods_on_responses_render_are_routed_as_vllms_app_routes_them(autojump_clock: MockClock) -> None:
    """Starlette takes the first route matching path and method: GET falls to
    /v1/responses/{response_id} (a response named "render"), PUT matches no method."""
    async with running() as sim:
        got, put = FakeResponse(), FakeResponse()
        await sim.app.handle(HttpRequest("GET", "/v1/responses/render"), got)
        await sim.app.handle(HttpRequest("PUT", "/v1/responses/render"), put)
    assert got.status == 404
    assert got.json()["error"]["message"] == "Response with id 'render' not found."
    assert put.status == 405
    assert put.headers[b"allow"] == b"POST"


async def test_messages_render_renders_the_prompt_of_v1_messages(autojump_clock: MockClock) -> None:
    request = {
        "model": "llmsim/sim-model",
        "max_tokens": 10,
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                ],
            }
        ],
    }
    async with running() as sim:
        body = (await post(sim, "/v1/messages/render", request)).json()
        counted = (await post(sim, "/v1/messages/count_tokens", request)).json()
    assert len(body["token_ids"]) == counted["input_tokens"]
    assert body["request_id"].startswith("chatcmpl-")
    assert body["sampling_params"]["max_tokens"] == 10
    # a converted stream asks for usage on every chunk (anthropic/serving.py:704-714)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["features"]["mm_hashes"] == {"image": [f"sim_img_0_{fnv1a_32('data:image/png;base64,iVBORw0KGgo='):x}"]}
    assert body["parse_context"]["tool_choice"] is None


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        (CHAT, {"messages": "hi"}, 400, "body.messages"),
        (CHAT, {"messages": HELLO, "kv_transfer_params": [1]}, 400, "Input should be a valid dictionary"),
        (CHAT, {"messages": HELLO, "priority": "high"}, 400, "body.priority"),
        (CHAT, {"messages": HELLO, "use_beam_search": True}, 400, "Beam search is not supported"),
        (CHAT, {"messages": HELLO, "model": "nope"}, 404, "The model `nope` does not exist"),
        (CHAT, {"messages": HELLO, "max_tokens": 10**6}, 400, "cannot be greater than max_model_len"),
        (
            CHAT,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}],
                    }
                ]
            },
            400,
            "Invalid base64 image data in messages[0].content[0].image_url.url",
        ),
        (
            CHAT,
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "not base64!"}}]}
                ]
            },
            400,
            "Invalid base64 audio data",
        ),
        ("/v1/completions/render", {"prompt": []}, 400, "at least one prompt"),
        ("/v1/completions/render", {"prompt": [2**31]}, 400, "Token id 2147483648 is out of vocabulary"),
        ("/v1/completions/render", {"prompt": [-1]}, 400, "Token id -1 is out of vocabulary"),
        ("/v1/responses/render", {"input": 5}, 400, "input"),
        (
            "/v1/messages/render",
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@"}}
                        ],
                    }
                ],
            },
            400,
            "Invalid base64 image data",
        ),
        ("/v1/messages/render", {"messages": HELLO}, 400, "max_tokens"),
    ],
)
async def test_bad_render_requests_get_a_4xx_envelope(
    autojump_clock: MockClock, path: str, body: dict[str, Any], status: int, fragment: str
) -> None:
    async with running() as sim:
        response = await post(sim, path, body)
        after = await post(sim, CHAT, {"messages": HELLO})
    assert response.status == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}  # vLLM's envelope, Anthropic's route too
    assert error["code"] == status
    assert fragment in error["message"] or fragment == error["param"] or fragment in str(error["param"])
    assert after.status == 200  # and the server keeps serving


@pytest.mark.parametrize(
    "path",
    [CHAT, "/v1/completions/render", "/v1/responses/render", "/v1/messages/render", "/inference/v1/generate"],
)
async def test_no_enable_scale_out_answers_vllms_403(autojump_clock: MockClock, path: str) -> None:
    async with running(enable_scale_out=False) as sim:
        response = await post(sim, path, b"not even json")
    # vllm/entrypoints/scale_out/factories.py:100-109: every route, whatever the body
    assert response.status == 403
    assert response.body == orjson.dumps(
        {"error": {"message": SCALE_OUT_DISABLED, "type": "PermissionDeniedError", "param": None, "code": 403}}
    )


ODD_VALUES = [None, 1, -1, 2**40, 1.5, "x", "", [], [1], [-1], ["a"], {}, {"a": 1}, [[1]], True]
RENDER_FIELDS = {
    CHAT: (
        {"messages": HELLO},
        ["messages", "max_tokens", "tools", "kv_transfer_params", "stream_options", "priority"],
    ),
    "/v1/completions/render": ({"prompt": "hi"}, ["prompt", "max_tokens", "echo", "logprobs", "vllm_xargs"]),
    "/v1/responses/render": ({"input": "hi"}, ["input", "instructions", "tools", "max_output_tokens", "truncation"]),
    "/v1/messages/render": ({"max_tokens": 3, "messages": HELLO}, ["messages", "max_tokens", "system", "tools"]),
}


@pytest.mark.parametrize("path", list(RENDER_FIELDS))
async def test_no_render_body_gets_a_5xx(autojump_clock: MockClock, path: str) -> None:
    base, fields = RENDER_FIELDS[path]
    bodies: list[object] = [b"", b"[]", b"null", b"{", b'"x"', {**base, "logit_bias": {"a": 1}}]
    bodies += [{**base, field: value} for field in fields for value in ODD_VALUES]
    statuses = set()
    async with running() as sim:
        for body in bodies:
            response = await post(sim, path, body)
            statuses.add(response.status)
            assert response.status < 500, (body, response.body)
    assert statuses >= {200, 400}
