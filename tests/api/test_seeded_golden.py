"""Golden bytes: what a seeded simulator answers to a fixed sequence of requests.

Pins everything ``--seed`` reproduces (request ids, text, lengths, tool calls,
logprobs) and the exact error envelope of malformed requests, on every generating
endpoint.  The requests run in order on one simulator: each request id comes from the
same id stream, so the order matters.  ``seeded_golden.json`` was captured from the
code before the API's per-request costs were cut (the two long cases at the end were
added when long texts came to be drawn as they are read, docs/performance.md "API
intake (stop 11)"); regenerate it only for an intended change of output, with
``python -m tests.api.test_seeded_golden``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from llmsim.api.http import Headers
from tests.api.fakes import post, running

GOLDEN = Path(__file__).with_name("seeded_golden.json")
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
REQUEST_ID = ((b"x-request-id", b"req-42"),)

#: (name, path, body, extra headers), answered in this order.  ``lax_*``: values vLLM's pydantic
#: models read in lax mode (``"2"`` for an integer, ``true`` for 1, ``"yes"``, ``1`` for true).
CASES: list[tuple[str, str, Any, Headers]] = [
    (
        "chat_stream_n2_usage",
        CHAT,
        {"messages": HELLO, "max_tokens": 5, "n": 2, "stream": True, "stream_options": {"include_usage": True}},
        (),
    ),
    ("chat_stream_ignore_eos", CHAT, {"messages": HELLO, "max_tokens": 3, "ignore_eos": True, "stream": True}, ()),
    ("chat_histogram", CHAT, {"messages": HELLO, "max_tokens": 40}, ()),
    ("chat_unbounded", CHAT, {"model": "llmsim/sim-model", "messages": HELLO}, ()),
    (
        "chat_parts_and_history",
        CHAT,
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Look"}, {"type": "image_url", "image_url": "http://x/y.png"}],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
                {"role": "assistant", "content": "So it"},
            ],
            "max_completion_tokens": 6,
            "echo": True,
        },
        (),
    ),
    (
        "chat_logprobs_stream",
        CHAT,
        {"messages": HELLO, "max_tokens": 3, "logprobs": True, "top_logprobs": 2, "stream": True},
        (),
    ),
    ("chat_tools_required", CHAT, {"messages": HELLO, "tools": [WEATHER], "tool_choice": "required", "n": 2}, ()),
    ("chat_tools_stream", CHAT, {"messages": HELLO, "tools": [WEATHER], "stream": True, "max_tokens": 12}, ()),
    ("chat_request_id", CHAT, {"messages": HELLO, "max_tokens": 8}, REQUEST_ID),
    (
        "completions_stream",
        COMPLETIONS,
        {"prompt": "Once upon a time", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}},
        (),
    ),
    ("completions_default_length", COMPLETIONS, {"prompt": "Once upon a time"}, ()),
    ("completions_n_echo", COMPLETIONS, {"prompt": ["Hi", "Bye now"], "n": 2, "max_tokens": 5, "echo": True}, ()),
    (
        "completions_token_ids_logprobs",
        COMPLETIONS,
        {"prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 2, "echo": True, "stream": True},
        (),
    ),
    ("responses", "/v1/responses", {"input": "Hi there", "max_output_tokens": 6}, ()),
    (
        "messages",
        "/v1/messages",
        {"model": "llmsim/sim-model", "max_tokens": 6, "messages": [{"role": "user", "content": "Hi"}]},
        (),
    ),
    (
        "messages_stream",
        "/v1/messages",
        {"model": "llmsim/sim-model", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
        (),
    ),
    ("responses_stream", "/v1/responses", {"input": "Hi there", "max_output_tokens": 3, "stream": True}, ()),
    ("bad_not_json", CHAT, b"{", ()),
    ("bad_array_body", CHAT, [1], ()),
    ("bad_missing_messages", CHAT, {"model": "x"}, ()),
    ("bad_messages_string", CHAT, {"messages": "hi"}, ()),
    ("bad_message_not_object", CHAT, {"messages": ["hi"]}, ()),
    ("bad_role_missing", CHAT, {"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}, ()),
    ("bad_role_type", CHAT, {"messages": [{"role": 1, "content": "a"}]}, ()),
    ("bad_content_type", CHAT, {"messages": [{"role": "user", "content": 5}]}, ()),
    ("bad_part_text", CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, ()),
    ("bad_part_missing_type", CHAT, {"messages": [{"role": "user", "content": [{"text": "a"}]}]}, ()),
    (
        "bad_part_url",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 1}}]}]},
        (),
    ),
    ("bad_part_kind", CHAT, {"messages": [{"role": "user", "content": [{"type": "pdf"}]}]}, ()),
    ("bad_tool_call", CHAT, {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]}, ()),
    (
        "bad_nested_part",
        CHAT,
        {
            "messages": [
                HELLO[0],
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "text", "text": None},
                        {"type": "text", "text": []},
                    ],
                },
            ]
        },
        (),
    ),
    ("bad_two_fields", CHAT, {"messages": "x", "n": "2", "stream": 1}, ()),
    ("lax_n_string", CHAT, {"messages": HELLO, "n": "2"}, ()),
    ("bad_n_float", CHAT, {"messages": HELLO, "n": 1.5}, ()),
    ("bad_n_zero", CHAT, {"messages": HELLO, "n": 0}, ()),
    ("lax_max_tokens_bool", CHAT, {"messages": HELLO, "max_tokens": True}, ()),
    ("lax_stream_string", CHAT, {"messages": HELLO, "stream": "yes"}, ()),
    ("bad_stream_options_type", CHAT, {"messages": HELLO, "stream": True, "stream_options": []}, ()),
    ("lax_include_usage", CHAT, {"messages": HELLO, "stream": True, "stream_options": {"include_usage": 1}}, ()),
    ("bad_stream_options_unstreamed", CHAT, {"messages": HELLO, "stream_options": {"include_usage": True}}, ()),
    ("bad_model_type", CHAT, {"messages": HELLO, "model": 3}, ()),
    ("bad_model_unknown", CHAT, {"messages": HELLO, "model": "nope"}, ()),
    ("bad_tools_empty", CHAT, {"messages": HELLO, "tools": []}, ()),
    ("bad_tool_type", CHAT, {"messages": HELLO, "tools": [{"type": "custom", "function": {"name": "f"}}]}, ()),
    ("bad_tool_name", CHAT, {"messages": HELLO, "tools": [{"function": {"name": 5}}]}, ()),
    ("bad_tool_choice", CHAT, {"messages": HELLO, "tools": [WEATHER], "tool_choice": "sometimes"}, ()),
    (
        "bad_tool_choice_name",
        CHAT,
        {"messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        (),
    ),
    ("bad_top_logprobs", CHAT, {"messages": HELLO, "logprobs": True, "top_logprobs": 99}, ()),
    ("bad_temperature_ignored", CHAT, {"messages": HELLO, "max_tokens": 1, "temperature": "hot"}, ()),
    ("bad_context_length", CHAT, {"messages": HELLO, "max_tokens": 10**6}, ()),
    ("bad_prompt_missing", COMPLETIONS, {"max_tokens": 3}, ()),
    ("bad_prompt_mixed", COMPLETIONS, {"prompt": ["a", 1]}, ()),
    ("bad_prompt_type", COMPLETIONS, {"prompt": 5}, ()),
    ("bad_prompt_empty", COMPLETIONS, {"prompt": []}, ()),
    ("bad_logprobs_range", COMPLETIONS, {"prompt": "a", "logprobs": 9}, ()),
    ("lax_echo_type", COMPLETIONS, {"prompt": "a", "echo": "yes"}, ()),
    ("bad_responses_input", "/v1/responses", {"input": [{"role": "user", "content": [{"type": 3}]}]}, ()),
    (
        "bad_messages_content",
        "/v1/messages",
        {"model": "llmsim/sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        (),
    ),
    # Long enough for the text drawn as it is read (llmsim/model/drawn.py), last
    # so that the request ids above stay as they were.
    ("chat_stream_long", CHAT, {"messages": HELLO, "max_tokens": 520, "ignore_eos": True, "stream": True}, ()),
    ("completions_long_eos", COMPLETIONS, {"prompt": "Hello", "max_tokens": 2000, "min_tokens": 530}, ()),
]


async def capture() -> dict[str, Any]:
    """Every case's status, headers and body, answered in order by one seeded simulator
    (and ``x-request-id`` by one without a seed: its text depends on the id alone)."""
    results: dict[str, Any] = {}
    async with running(seed=1234) as sim:
        for name, path, body, headers in CASES:
            response = await post(sim, path, body, headers)
            results[name] = _result(response.status, response.headers, response.body)
    async with running(seed=None) as sim:
        response = await post(sim, CHAT, {"messages": HELLO, "max_tokens": 8}, REQUEST_ID)
        results["unseeded_request_id"] = _result(response.status, response.headers, response.body)
    return results


def _result(status: int | None, headers: dict[bytes, bytes], body: bytes) -> dict[str, Any]:
    return {
        "status": status,
        "headers": {key.decode(): value.decode() for key, value in sorted(headers.items())},
        "body": body.decode(),
    }


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())  # type: ignore[no-any-return]


async def test_seeded_responses_match_the_golden_bytes(autojump_clock: MockClock, golden: dict[str, Any]) -> None:
    results = await capture()
    assert list(results) == list(golden)
    for name, expected in golden.items():
        assert results[name] == expected, name


def _regenerate() -> None:
    results = trio.run(capture, clock=MockClock(autojump_threshold=0))
    GOLDEN.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    _regenerate()
