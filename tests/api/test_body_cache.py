"""Parsed request bodies remembered per distinct body (``llmsim.api.context.BodyCache``,
``Call.parsed``), and the chat and completions routes that memoize on them."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmsim.api.context import BodyCache
from llmsim.api.errors import ApiError
from llmsim.api.http import HttpRequest
from tests.api.fakes import FakeResponse, post, running, sse_payloads
from tests.model.hf_dir import build_tokenizer_dir

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3}


class Parser:
    """A parse function that counts its calls and fails on ``{"fail": true}``."""

    def __init__(self, tag: str = "") -> None:
        self.calls = 0
        self.tag = tag

    def __call__(self, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.calls += 1
        if fields.get("fail"):
            raise ApiError(400, "refused")
        return self.tag, fields


def parse_with(cache: BodyCache, parse: Parser, body: bytes) -> object:
    return cache.parsed(body, parse, lambda: orjson.loads(body))


def test_a_body_is_parsed_once_per_parse_function_and_exact_bytes() -> None:
    cache, chat, completions = BodyCache(), Parser("chat"), Parser("completions")
    first = parse_with(cache, chat, b'{"a": 1}')
    assert parse_with(cache, chat, b'{"a": 1}') is first
    assert chat.calls == 1
    assert parse_with(cache, chat, b'{"a": 2}') == ("chat", {"a": 2})  # one byte apart: its own entry
    assert parse_with(cache, chat, b'{"a":1}') == ("chat", {"a": 1})  # the same JSON, other bytes
    assert chat.calls == 3
    assert parse_with(cache, completions, b'{"a": 1}') == ("completions", {"a": 1})  # keyed by the parser too
    assert completions.calls == 1


def test_a_body_that_fails_to_parse_is_not_kept() -> None:
    cache, parse = BodyCache(), Parser()
    for calls in (1, 2):
        with pytest.raises(ApiError):
            parse_with(cache, parse, b'{"fail": true}')
        assert parse.calls == calls
    assert len(cache) == 0


def test_the_cache_is_bounded_oldest_first_and_skips_large_bodies() -> None:
    cache, parse = BodyCache(), Parser()
    bodies = [orjson.dumps({"i": i}) for i in range(BodyCache.KEPT + 5)]
    for body in bodies:
        parse_with(cache, parse, body)
    assert len(cache) == BodyCache.KEPT
    parse_with(cache, parse, bodies[-1])  # kept
    assert parse.calls == len(bodies)
    parse_with(cache, parse, bodies[0])  # forgotten: parsed again
    assert parse.calls == len(bodies) + 1
    large = orjson.dumps({"text": "x" * BodyCache.LARGEST})
    parse_with(cache, parse, large)
    parse_with(cache, parse, large)
    assert parse.calls == len(bodies) + 3


async def test_a_remembered_body_still_has_its_content_type_checked() -> None:
    async with running() as sim:
        assert (await post(sim, "/v1/chat/completions", CHAT)).status == 200
        request = HttpRequest(
            "POST", "/v1/chat/completions", headers=((b"content-type", b"text/plain"),), body=orjson.dumps(CHAT)
        )
        response = FakeResponse()
        await sim.app.handle(request, response)
        assert response.status == 400
        assert "Unsupported Media Type" in response.json()["error"]["message"]


async def test_the_same_body_gets_its_own_text_per_request_id() -> None:
    """The parse is shared, the plan is not: each request's text comes from its own RNG."""
    async with running() as sim:
        texts = set()
        for request_id in ("a", "b", "a"):
            body = {**CHAT, "max_tokens": 30, "ignore_eos": True, "request_id": request_id}
            response = await post(sim, "/v1/chat/completions", body)
            texts.add((request_id, response.json()["choices"][0]["message"]["content"]))
        assert len(texts) == 2  # "a" twice gives the same text, "b" another


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"prompt": "Hello there", "max_tokens": 3}),
    ],
)
async def test_prompt_tokens_of_a_remembered_body_are_the_servers_own(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    """What a route keeps with a parsed body (its prompt's token ids) depends on the
    tokenizer: each server has its own cache, so another tokenizer counts afresh."""
    counts = []
    for config in ({}, {"tokenizer": str(build_tokenizer_dir(tmp_path / "llama"))}):
        async with running(**config) as sim:
            for _ in range(2):  # the second request hits the cache
                response = await post(sim, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
                counts.append(sse_payloads(response.body)[-2]["usage"]["prompt_tokens"])
    assert counts[0] == counts[1] and counts[2] == counts[3]
    assert counts[0] != counts[2]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": 40}),
        ("/v1/completions", {"prompt": "Hello there", "max_tokens": 40}),
    ],
)
async def test_checks_passed_once_per_body_are_the_servers_own(path: str, body: dict[str, Any]) -> None:
    """The output cap a route keeps with a parsed body once its checks passed holds for
    its server only: a server with a smaller context window refuses the same body, every
    time, and the first keeps answering it."""
    async with running() as roomy, running(max_model_len=32) as tight:
        for _ in range(2):
            assert (await post(roomy, path, body)).status == 200
            response = await post(tight, path, body)
            assert response.status == 400, response.body
            assert "max_model_len" in response.body.decode() or "context length" in response.body.decode()


async def test_prompt_ids_of_a_model_template_are_made_afresh(tmp_path: Path) -> None:
    """A model's chat template may read the clock (``strftime_now``): its prompt ids, and
    the output cap that depends on their count, are not kept with the body."""
    async with running(tokenizer=str(build_tokenizer_dir(tmp_path / "llama"))) as sim:
        for _ in range(2):
            assert (await post(sim, "/v1/chat/completions", CHAT)).status == 200
        kept = list(sim.ctx.bodies._entries.values())
    assert len(kept) == 1
    assert kept[0].prompt_ids is None and kept[0].cap is None and kept[0].prompt is None  # type: ignore[attr-defined]
    async with running() as sim:
        assert (await post(sim, "/v1/chat/completions", CHAT)).status == 200
        kept = list(sim.ctx.bodies._entries.values())
    assert kept[0].prompt_ids is not None and kept[0].cap is not None and kept[0].prompt is not None  # type: ignore[attr-defined]


class Counting:
    """Wraps a route module's function, counting its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> None:
        self.calls = 0
        real = getattr(importlib.import_module(module), name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(f"{module}.{name}", counted)


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


async def test_a_chat_bodys_tools_and_structured_output_are_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept with the body (``_ChatShape``) once they compiled: the body's later requests
    skip them; another body compiles its own."""
    tools = Counting(monkeypatch, "llmsim.api.chat.routes", "tool_specs")
    structured = Counting(monkeypatch, "llmsim.api.chat.routes", "structured_output")
    body = {**CHAT, "tools": TOOLS, "tool_choice": "none", "response_format": {"type": "json_object"}}
    async with running() as sim:
        for _ in range(3):
            assert (await post(sim, "/v1/chat/completions", body)).status == 200
        assert (tools.calls, structured.calls) == (1, 1)
        assert (await post(sim, "/v1/chat/completions", {**body, "max_tokens": 4})).status == 200
        assert (tools.calls, structured.calls) == (2, 2)


async def test_a_completions_bodys_structured_output_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    structured = Counting(monkeypatch, "llmsim.api.completions.routes", "structured_output")
    body = {"prompt": "Hello there", "max_tokens": 3, "structured_outputs": {"choice": ["yes", "no"]}}
    async with running() as sim:
        for _ in range(3):
            response = await post(sim, "/v1/completions", body)
            assert response.json()["choices"][0]["text"] in ("yes", "no")
        assert structured.calls == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_what_a_body_fails_is_refused_every_time_and_kept_only_once_passed(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A structured output that does not compile is its 400 at every request (nothing is
    kept); a request refused before it (X-Return-Error) keeps nothing either, and the
    body's next request compiles it."""
    module = "llmsim.api.chat.routes" if path.startswith("/v1/chat") else "llmsim.api.completions.routes"
    structured = Counting(monkeypatch, module, "structured_output")
    base = CHAT if path.startswith("/v1/chat") else {"prompt": "Hello there", "max_tokens": 3}
    bad = {**base, "response_format": {"type": "structural_tag"}}
    async with running() as sim:
        for calls in (1, 2):
            response = await post(sim, path, bad)
            assert response.status == 400 and "structural_tag" in response.body.decode()
            assert structured.calls == calls
        good = {**base, "response_format": {"type": "json_object"}}
        assert (await post(sim, path, good, ((b"x-return-error", b"503"),))).status == 503
        assert structured.calls == 2
        for _ in range(2):
            assert (await post(sim, path, good)).status == 200
        assert structured.calls == 3


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "ignore_eos": True}),
        ("/v1/completions", {"prompt": "Hello there", "max_tokens": 3, "ignore_eos": True}),
    ],
)
async def test_a_kept_prompt_plan_holds_for_its_cache_gate_only(path: str, body: dict[str, Any]) -> None:
    """The prompt's plan kept with a body carries the engine's cache-hit gate, which is
    per request (X-Cache-Threshold-Finish-Reason): a request with another gate gets its own."""
    force = ((b"x-cache-threshold-finish-reason", b"true"),)
    async with running() as sim:
        reasons = []
        for headers in ((), force, force, (), force):
            response = await post(sim, path, body, headers)
            reasons.append(response.json()["choices"][0]["finish_reason"])
    assert reasons == ["length", "cache_threshold", "cache_threshold", "length", "cache_threshold"]


async def test_a_prompt_plan_with_media_is_made_afresh() -> None:
    """A chat body's media blocks are read (and checked) once per body, but their KV keys
    come from the prompt's rendering, per request: a prompt plan with media is not kept.
    Media that fail their check are refused every time."""
    image = "data:image/png;base64,iVBORw0KGgo="
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": image}}]
    with_media = {**CHAT, "messages": [{"role": "user", "content": content}]}
    bad = [content[0], {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}]
    bad_media = {**CHAT, "messages": [{"role": "user", "content": bad}]}
    async with running() as sim:
        for _ in range(2):
            assert (await post(sim, "/v1/chat/completions", with_media)).status == 200
            response = await post(sim, "/v1/chat/completions", bad_media)
            assert response.status == 400 and "Invalid base64" in response.body.decode()
        assert (await post(sim, "/v1/chat/completions", CHAT)).status == 200
        kept = list(sim.ctx.bodies._entries.values())
    media = [entry.media_items for entry in kept]  # type: ignore[attr-defined]
    assert [None if items is None else len(items) for items in media] == [1, None, 0]  # the bad media: not kept
    assert [entry.prompt is None for entry in kept] == [True, True, False]  # type: ignore[attr-defined]


async def test_a_bodys_out_of_vocab_token_ids_are_refused_on_every_request() -> None:
    """Whether a body has token ids to check is kept with it (``_ChatShape``); the check
    itself, and its in-band error on a stream, comes with every request of that body,
    while a body without any streams its tokens."""
    refused = {**CHAT, "stream": True, "stop_token_ids": [2**31]}  # the vocabulary: 2**31 ids
    async with running() as sim:
        for _ in range(3):
            payloads = sse_payloads((await post(sim, "/v1/chat/completions", refused)).body)
            assert "out-of-vocab" in payloads[0]["error"]["message"]
            assert payloads[-1] == "[DONE]"
            plain = sse_payloads((await post(sim, "/v1/chat/completions", {**CHAT, "stream": True})).body)
            assert all("error" not in payload for payload in plain[:-1])
            assert plain[-2]["choices"][0]["finish_reason"] is not None


@pytest.mark.parametrize(
    ("path", "body", "text_of"),
    [
        ("/v1/chat/completions", CHAT, lambda choice: choice["delta"].get("content", "")),
        ("/v1/completions", {"prompt": "Hello there"}, lambda choice: choice["text"]),
    ],
)
async def test_a_stream_names_a_stop_string_only_when_one_ended_it(
    path: str, body: dict[str, Any], text_of: Any
) -> None:
    """Without a stop rule no choice has a stop reason (the route passes none); with one,
    the last chunk names the string that ended the choice, request after request."""
    ignore = {**body, "stream": True, "max_tokens": 30, "ignore_eos": True, "request_id": "r"}
    async with running() as sim:
        payloads = sse_payloads((await post(sim, path, ignore)).body)[:-1]
        word = "".join(text_of(payload["choices"][0]) for payload in payloads if payload["choices"]).split()[2]
        for _ in range(2):
            plain = sse_payloads((await post(sim, path, ignore)).body)
            assert plain[-2]["choices"][0]["stop_reason"] is None
            stopped = sse_payloads((await post(sim, path, {**ignore, "stop": [word]})).body)
            assert stopped[-2]["choices"][0]["stop_reason"] == word
            assert stopped[-2]["choices"][0]["finish_reason"] == "stop"
