"""``--mm-encoder-only``: an encoder pod of E/PD disaggregation, as llm-d-inference-sim
simulates it.  Every answer is ``"!"`` once per ``max_tokens``, finish ``length``
(``MMEncoderOnlyDataset``, pkg/dataset/dataset.go:69-111), and chat and generate answers
carry one ``ec_transfer_params`` placeholder per multimodal item, keyed by its hash
(``buildECTransferParams``, pkg/llm-d-inference-sim/helpers.go:90-106;
chat_completion.go:107-112, generate.go:86-89).  vLLM's response models have the field
(vllm/entrypoints/openai/chat_completion/protocol.py:162-164)."""

from __future__ import annotations

import base64
from typing import Any

from trio.testing import MockClock

from tests.api.fakes import post, running

CONTENT = [
    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    {"type": "text", "text": "and"},
    {"type": "video_url", "video_url": {"url": "https://example.com/b.mp4"}},
]
CHAT = {"messages": [{"role": "user", "content": CONTENT}], "max_tokens": 3}
PLACEHOLDER = {
    "peer_host": "DUMMY",
    "peer_port": 1234,
    "size_bytes": 2359296,
    "nixl_agent_metadata_b64": base64.b64encode(b"NIXL_METADATA_PLACEHOLDER").decode(),
}


async def test_a_chat_answer_is_bangs_with_one_ec_entry_per_media_item(autojump_clock: MockClock) -> None:
    async with running(mm_encoder_only=True) as sim:
        rendered = (await post(sim, "/v1/chat/completions/render", CHAT)).json()
        answer = (await post(sim, "/v1/chat/completions", CHAT)).json()
        unset = (await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": None})).json()
        text_only = (await post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})).json()
    choice = answer["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("!!!", "length")
    assert answer["usage"]["completion_tokens"] == 3
    hashes = [digest for digests in rendered["features"]["mm_hashes"].values() for digest in digests]
    assert len(hashes) == 2
    assert answer["ec_transfer_params"] == dict.fromkeys(hashes, PLACEHOLDER)
    assert unset["choices"][0]["message"]["content"] == "!"
    assert text_only["ec_transfer_params"] is None


async def test_a_generate_answer_names_its_features_hashes(autojump_clock: MockClock) -> None:
    async with running(mm_encoder_only=True) as sim:
        rendered = (await post(sim, "/v1/chat/completions/render", CHAT)).json()
        answer = (await post(sim, "/inference/v1/generate", rendered)).json()
    hashes = [digest for digests in rendered["features"]["mm_hashes"].values() for digest in digests]
    assert answer["ec_transfer_params"] == dict.fromkeys(hashes, PLACEHOLDER)
    assert answer["choices"][0]["finish_reason"] == "length"


async def test_without_the_flag_answers_are_text_and_carry_no_ec_params(autojump_clock: MockClock) -> None:
    async with running() as sim:
        answer: dict[str, Any] = (await post(sim, "/v1/chat/completions", CHAT)).json()
        completion = (await post(sim, "/v1/completions", {"prompt": "Hello", "max_tokens": 2})).json()
    assert answer["ec_transfer_params"] is None
    assert answer["choices"][0]["message"]["content"] != "!!!"
    assert completion["choices"][0]["text"] != "!!"


async def test_every_text_endpoint_answers_bangs(autojump_clock: MockClock) -> None:
    async with running(mm_encoder_only=True) as sim:
        completion = (await post(sim, "/v1/completions", {"prompt": "Hello", "max_tokens": 2})).json()
        responses = (await post(sim, "/v1/responses", {"input": "Hello", "max_output_tokens": 4})).json()
    assert (completion["choices"][0]["text"], completion["choices"][0]["finish_reason"]) == ("!!", "length")
    assert responses["output"][0]["content"][0]["text"] == "!!!!"
