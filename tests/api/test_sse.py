"""SSE helpers: escaping (against the JSON the chunks must stay), the in-band error."""

from __future__ import annotations

import json

import orjson
from hypothesis import given
from hypothesis import strategies as st

from llmsim._version import __version__
from llmsim.api import sse
from llmsim.api.errors import ApiError


@given(st.text())
def test_escape_is_exactly_the_inside_of_a_json_string(text: str) -> None:
    escaped = sse.escape(text)
    assert b'"' + escaped + b'"' == orjson.dumps(text)
    assert json.loads(b'"' + escaped + b'"') == text
    assert sse.escape_uncached(text) == escaped


def test_escape_writes_utf8_and_short_control_escapes() -> None:
    text = 'a"b\\c\n\t\r\x08\x0c\x1f/\u00e9\u2028'
    assert sse.escape(text) == 'a\\"b\\\\c\\n\\t\\r\\b\\f\\u001f/\u00e9\u2028'.encode()


def test_the_piece_cache_stays_bounded() -> None:
    for i in range(sse._CACHE_LIMIT + 10):
        sse.escape(f"piece {i}")
    assert 0 < len(sse._escaped) <= sse._CACHE_LIMIT
    long_text = "x" * (sse._CACHED_LENGTH + 1)
    sse.escape(long_text)
    assert long_text not in sse._escaped


def test_error_events_are_vllms_bytes_then_done() -> None:
    error = ApiError(400, "bad \u00e9", param="n")
    assert sse.error_events(error) == (
        b'data: {"error": {"message": "bad \\u00e9", "type": "BadRequestError", "param": "n", "code": 400}}\n\n'
        b"data: [DONE]\n\n"
    )


def test_chat_error_events_are_compact() -> None:
    # chat dumps the ErrorResponse with model_dump_json (UTF-8, compact), completions with
    # json.dumps (vllm/entrypoints/openai/chat_completion/serving.py:496-497,951-953)
    error = ApiError(400, "bad \u00e9", param="n")
    assert sse.error_events(error, compact=True) == (
        b'data: {"error":{"message":"bad \xc3\xa9","type":"BadRequestError","param":"n","code":400}}\n\n'
        b"data: [DONE]\n\n"
    )


def test_sse_content_type() -> None:
    assert (
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"x-llmsim-version", __version__.encode()),
    ) == sse.SSE_HEADERS


@given(st.lists(st.text(max_size=70) | st.sampled_from(["", " the", "\n"]), max_size=6))
def test_escape_all_is_escape_of_each_piece(pieces: list[str]) -> None:
    sse.escape(pieces[0] if pieces else "")  # some cached, some not (long ones never are)
    assert sse.escape_all(pieces) == [orjson.dumps(piece)[1:-1] for piece in pieces]


@given(st.text(), st.integers(0, 2**40), st.text())
def test_chunk_head_is_the_json_prefix_of_a_chunk(response_id: str, created: int, model: str) -> None:
    head = sse.chunk_head(response_id, b'"chat.completion.chunk"', created, model)
    chunk = json.loads(head.removeprefix(b"data: ") + b'"choices":[]}')
    assert chunk == {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
    }
    assert head.startswith(
        b'data: {"id":' + orjson.dumps(response_id) + b',"object":"chat.completion.chunk","created":'
    )


@given(st.text(), st.sampled_from([b'"chat.completion.chunk"', b'"text_completion"']), st.integers(0, 2**40), st.text())
def test_chunk_head_is_its_json_prefix_whatever_it_remembers(
    response_id: str, kind: bytes, created: int, model: str
) -> None:
    """The part after the id is remembered per kind, second and model (``_head_rest``):
    each of them shows in the bytes."""
    head = sse.chunk_head(response_id, kind, created, model)
    assert head.startswith(b"data: ") and head.endswith(b",")
    fields = orjson.loads(head[len(b"data: ") : -1] + b"}")
    assert fields == {"id": response_id, "object": orjson.loads(kind), "created": created, "model": model}
    assert list(fields) == ["id", "object", "created", "model"]
    assert sse._head_rest.cache_info().maxsize == 64
