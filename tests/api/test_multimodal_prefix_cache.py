"""Prefix caching of prompts with media: the KV block keys carry each item's mm hash
over the blocks its placeholder overlaps (llm-d-inference-sim pkg/kv-cache/kv_cache.go:
111-121), so the same text with another image shares only the blocks before the image,
and a rendered request replayed through /inference/v1/generate hits what the chat
request cached."""

from __future__ import annotations

from typing import Any

import pytest
from trio.testing import MockClock

from llmsim.app import Simulator
from tests.api.fakes import post, running

BLOCK = 8
KV = {"enable_kvcache": True, "enable_prompt_tokens_details": True, "block_size": BLOCK, "kv_cache_size": 500}
TEXT = "Describe the harbour, the boats and the weather in this picture, with care and in detail " * 2


def _chat(image: str) -> dict[str, Any]:
    content = [
        {"type": "text", "text": TEXT},
        {"type": "image_url", "image_url": {"url": image}},
        {"type": "text", "text": "and then tell me what the people on the quay are doing, one by one."},
    ]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2}


def _messages(image: str) -> dict[str, Any]:
    content = [
        {"type": "text", "text": TEXT},
        {"type": "image", "source": {"type": "url", "url": image}},
        {"type": "text", "text": "and then tell me what the people on the quay are doing, one by one."},
    ]
    return {"model": "llmsim/sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": 2}


def _responses(image: str) -> dict[str, Any]:
    content = [
        {"type": "input_text", "text": TEXT},
        {"type": "input_image", "image_url": image},
        {"type": "input_text", "text": "and then tell me what the people on the quay are doing, one by one."},
    ]
    return {"input": [{"role": "user", "content": content}], "max_output_tokens": 2}


async def _cached(sim: Simulator, path: str, body: dict[str, Any]) -> tuple[int, int]:
    """The prompt tokens and cached tokens one request reports."""
    response = await post(sim, path, body)
    assert response.status == 200, response.body
    usage = response.json()["usage"]
    if path == "/v1/messages":  # Anthropic usage: input tokens, cache reads
        return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0), usage["cache_read_input_tokens"]
    if path == "/v1/responses":
        return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


async def _image_offset(sim: Simulator, path: str, body: dict[str, Any]) -> int:
    """Where the image's placeholder starts in the prompt, as the render endpoint says."""
    response = await post(sim, path + "/render", body)
    assert response.status == 200, response.body
    (placeholder,) = response.json()["features"]["mm_placeholders"]["image"]
    return int(placeholder["offset"])


async def test_chat_with_another_image_shares_only_the_text_before_it(autojump_clock: MockClock) -> None:
    async with running(**KV) as sim:
        offset = await _image_offset(sim, "/v1/chat/completions", _chat("https://example.com/a.png"))
        prompt, first = await _cached(sim, "/v1/chat/completions", _chat("https://example.com/a.png"))
        _, other = await _cached(sim, "/v1/chat/completions", _chat("https://example.com/b.png"))
        _, same = await _cached(sim, "/v1/chat/completions", _chat("https://example.com/a.png"))
    assert offset >= 2 * BLOCK and prompt - offset > 2 * BLOCK  # blocks on both sides of the image
    assert first == 0
    assert other == offset // BLOCK * BLOCK  # the full blocks before the image's block
    assert same == (prompt - 1) // BLOCK * BLOCK  # every full block but the one holding the last token


async def test_the_same_tokens_without_the_image_hit_only_the_text_before_it(autojump_clock: MockClock) -> None:
    """The rendered prompt's token ids posted to /inference/v1/generate without its
    ``features``: the same tokens, but the stand-in text is not the image."""
    async with running(**KV) as sim:
        rendered = (await post(sim, "/v1/chat/completions/render", _chat("https://example.com/a.png"))).json()
        await _cached(sim, "/v1/chat/completions", _chat("https://example.com/a.png"))
        generate = {"token_ids": rendered["token_ids"], "sampling_params": {"max_tokens": 2}}
        _, cached = await _cached(sim, "/inference/v1/generate", generate)
    assert cached == rendered["features"]["mm_placeholders"]["image"][0]["offset"] // BLOCK * BLOCK


@pytest.mark.parametrize(("path", "body"), [("/v1/messages", _messages), ("/v1/responses", _responses)])
async def test_messages_and_responses_key_their_images_too(autojump_clock: MockClock, path: str, body: Any) -> None:
    async with running(**KV) as sim:
        offset = await _image_offset(sim, path, body("https://example.com/a.png"))
        prompt, first = await _cached(sim, path, body("https://example.com/a.png"))
        _, other = await _cached(sim, path, body("https://example.com/b.png"))
        _, same = await _cached(sim, path, body("https://example.com/a.png"))
    assert first == 0
    assert other == offset // BLOCK * BLOCK
    assert same == (prompt - 1) // BLOCK * BLOCK


async def test_a_rendered_chat_request_generates_from_the_blocks_the_chat_cached(autojump_clock: MockClock) -> None:
    """/inference/v1/generate keys its prompt by the ``features`` it is given: the render
    of a chat request (token ids and features) hits every block the chat request stored,
    and the same token ids with other features hit only the blocks before the image."""
    async with running(**KV) as sim:
        chat = _chat("https://example.com/a.png")
        rendered = (await post(sim, "/v1/chat/completions/render", chat)).json()
        prompt, _ = await _cached(sim, "/v1/chat/completions", chat)
        generate = {"token_ids": rendered["token_ids"], "features": rendered["features"]}
        generate["sampling_params"] = {"max_tokens": 2}
        _, same = await _cached(sim, "/inference/v1/generate", generate)
        features = rendered["features"]
        features["mm_hashes"] = {"image": ["sim_img_0_0"]}
        _, other = await _cached(sim, "/inference/v1/generate", {**generate, "features": features})
    offset = rendered["features"]["mm_placeholders"]["image"][0]["offset"]
    assert same == (prompt - 1) // BLOCK * BLOCK
    assert other == offset // BLOCK * BLOCK


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", _chat("data:image/png;base64,not*base64")),
        ("/v1/messages", _messages("data:image/png;base64,not*base64")),
        ("/v1/responses", _responses("data:image/png;base64,not*base64")),
    ],
)
async def test_media_the_render_refuses_are_refused_by_generation_too(
    autojump_clock: MockClock, path: str, body: dict[str, Any]
) -> None:
    """The items are read once, with their check: bad base64 is vLLM's 400 when it loads
    the media, on the generating endpoint as on its render."""
    async with running(**KV) as sim:
        rendered = await post(sim, path + "/render", body)
        generated = await post(sim, path, body)
    assert rendered.status == generated.status == 400
    assert "Invalid base64 image data" in generated.json()["error"]["message"]
