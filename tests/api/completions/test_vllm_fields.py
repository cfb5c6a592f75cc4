"""vLLM's request naming, ``system_fingerprint`` and ``prompt_tokens_details`` on chat
and completions, through the real router, engine and text generator."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from tests.api.fakes import post, running, sse_payloads

CHAT = ("/v1/chat/completions", "chatcmpl-", {"messages": [{"role": "user", "content": "hi"}]})
COMPLETIONS = ("/v1/completions", "cmpl-", {"prompt": "The capital of France is"})
FAMILIES = pytest.mark.parametrize(("path", "prefix", "base"), [CHAT, COMPLETIONS], ids=["chat", "completions"])


@FAMILIES
async def test_a_body_request_id_names_the_request(
    path: str, prefix: str, base: dict[str, Any], autojump_clock: MockClock
) -> None:
    """``_base_request_id(raw_request, request.request_id)``: the X-Request-Id header
    first, else the body's ``request_id`` (vllm/entrypoints/serve/engine/serving.py:133-142;
    chat_completion/serving.py:321, completion/serving.py:147).  The id also seeds the
    text, so the same id says the same thing."""
    body = {**base, "max_tokens": 4, "ignore_eos": True}
    async with running() as sim:
        named = await post(sim, path, {**body, "request_id": "job-42"})
        again = await post(sim, path, {**body, "request_id": "job-42"})
        header = await post(sim, path, {**body, "request_id": "job-42"}, headers=((b"x-request-id", b"hdr-1"),))
        streamed = await post(sim, path, {**body, "request_id": "job-7", "stream": True})
    assert orjson.loads(named.body)["id"] == prefix + "job-42"
    assert b"x-request-id" not in named.headers  # only the header is echoed back
    assert orjson.loads(again.body)["choices"] == orjson.loads(named.body)["choices"]
    assert orjson.loads(header.body)["id"] == prefix + "hdr-1"
    assert header.headers[b"x-request-id"] == b"hdr-1"
    assert {chunk["id"] for chunk in sse_payloads(streamed.body)[:-1]} == {prefix + "job-7"}


@FAMILIES
async def test_a_request_id_that_is_not_a_string_is_a_400(
    path: str, prefix: str, base: dict[str, Any], autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, path, {**base, "request_id": 5})
    assert response.status == 400


@FAMILIES
async def test_the_fingerprint_is_vllms_default_for_the_version_simulated(
    path: str, prefix: str, base: dict[str, Any], autojump_clock: MockClock
) -> None:
    """``vllm-<version>-<hash8>`` (vllm/entrypoints/serve/utils/fingerprint.py:48-84) in
    the body, on the finishing chunk without a usage chunk and on the usage chunk
    (chat_completion/serving.py:824-834, 903-912; completion/serving.py:467-476, 535-546)."""
    body = {**base, "max_tokens": 2, "ignore_eos": True}
    async with running() as sim:
        whole = orjson.loads((await post(sim, path, body)).body)
        bare = sse_payloads((await post(sim, path, {**body, "stream": True})).body)
        with_usage = sse_payloads(
            (await post(sim, path, {**body, "stream": True, "stream_options": {"include_usage": True}})).body
        )
    async with running(vllm_version="0.30.0") as sim:
        other = orjson.loads((await post(sim, path, body)).body)
    fingerprint = whole["system_fingerprint"]
    assert fingerprint.startswith("vllm-0.33.0-") and len(fingerprint) == len("vllm-0.33.0-") + 8
    assert other["system_fingerprint"] == "vllm-0.30.0-" + fingerprint[-8:]
    assert [chunk.get("system_fingerprint") for chunk in bare[:-1]][-2:] == [None, fingerprint]
    assert [chunk.get("system_fingerprint") for chunk in with_usage[:-1]][-2:] == [None, fingerprint]
    assert with_usage[-2]["choices"] == []


@FAMILIES
async def test_prompt_tokens_details_only_with_the_flag(
    path: str, prefix: str, base: dict[str, Any], autojump_clock: MockClock
) -> None:
    """``prompt_tokens_details`` is null unless --enable-prompt-tokens-details
    (chat_completion/serving.py:95-114; completion/serving.py:508-511, 668-675); the
    usage chunk leaves null keys out (exclude_none)."""
    body = {**base, "max_tokens": 2, "ignore_eos": True}
    streaming = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with running() as sim:
        plain = orjson.loads((await post(sim, path, body)).body)["usage"]
        plain_chunk = sse_payloads((await post(sim, path, streaming)).body)[-2]["usage"]
    async with running(enable_prompt_tokens_details=True) as sim:
        detailed = orjson.loads((await post(sim, path, body)).body)["usage"]
        detailed_chunk = sse_payloads((await post(sim, path, streaming)).body)[-2]["usage"]
    assert plain["prompt_tokens_details"] is None and plain["completion_tokens_details"] is None
    assert "prompt_tokens_details" not in plain_chunk and "completion_tokens_details" not in plain_chunk
    prompt_tokens = plain["prompt_tokens"]
    created = prompt_tokens - prompt_tokens % 16 if path == CHAT[0] else None
    assert detailed["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": created,
        "multimodal_tokens": None,
    }
    assert detailed_chunk["prompt_tokens_details"] == {
        key: value for key, value in detailed["prompt_tokens_details"].items() if value is not None
    }
