"""POST /tokenize and POST /detokenize through the real router, in vLLM 0.33's shapes
(``vllm/entrypoints/serve/tokenize/``: ``protocol.py`` for the bodies, ``serving.py:57-163``
for what is done with them), on the simulated tokenizer and on a small tokenizer built
here with a Llama 3 style chat template (``tests/model/hf_dir.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from llmsim.app import Simulator
from llmsim.config import ConfigError
from tests.api.fakes import FakeResponse, make_simulator, post, running
from tests.model.hf_dir import ALTERNATING, BOS, VISION, build_tokenizer_dir

HEADER = "<|start_header_id|>{}<|end_header_id|>\n\n"
CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer_dir(tmp_path_factory.mktemp("llama"))


@asynccontextmanager
async def llama(model_dir: Path) -> AsyncIterator[Simulator]:
    async with running(tokenizer=str(model_dir)) as sim:
        yield sim


def body(response: FakeResponse) -> Any:
    return orjson.loads(response.body)


async def tokenize(sim: Simulator, request: dict[str, Any]) -> dict[str, Any]:
    response = await post(sim, "/tokenize", request)
    assert response.status == 200, response.body
    result: dict[str, Any] = body(response)
    return result


async def detokenize(sim: Simulator, tokens: list[int]) -> str:
    response = await post(sim, "/detokenize", {"tokens": tokens})
    assert response.status == 200, response.body
    text: str = body(response)["prompt"]
    return text


async def chat_prompt_tokens(sim: Simulator, request: dict[str, Any]) -> int:
    response = await post(sim, "/v1/chat/completions", {**request, "max_tokens": 1})
    assert response.status == 200, response.body
    count: int = body(response)["usage"]["prompt_tokens"]
    return count


# --- the simulated tokenizer ----------------------------------------------------------------------


async def test_completion_form_body_is_vllms(autojump_clock: MockClock) -> None:
    """``TokenizeResponse`` dumped whole, in field order, ``token_strs`` null unless
    asked (protocol.py:182-186, serving.py:125-135)."""
    async with running(max_model_len=4096) as sim:
        plain = await post(sim, "/tokenize", {"prompt": "Hello there, world!"})
        strings = await post(sim, "/tokenize", {"prompt": "Hello there, world!", "return_token_strs": True})
        ids = sim.ctx.tokenizer.encode("Hello there, world!")
    listed = ",".join(map(str, ids)).encode()
    assert plain.status == 200
    assert plain.body == b'{"count":5,"max_model_len":4096,"tokens":[' + listed + b'],"token_strs":null}'
    assert body(strings)["token_strs"] == ["Hello ", "there", ", ", "world", "!"]
    assert plain.headers[b"content-type"] == b"application/json"


@pytest.mark.parametrize("text", ["Hello there, world!", "  spaced\n\ttext  ", "émoji 🙂 and 漢字", "a" * 40])
async def test_round_trip_on_the_simulated_tokenizer(autojump_clock: MockClock, text: str) -> None:
    async with running() as sim:
        tokens = (await tokenize(sim, {"prompt": text}))["tokens"]
        assert await detokenize(sim, tokens) == text


async def test_chat_form_counts_what_chat_completions_count(autojump_clock: MockClock) -> None:
    """The chat form renders as the chat route does, so ``count`` is ``usage.prompt_tokens``,
    tools included; ``add_generation_prompt: false`` leaves the assistant header out."""
    async with running() as sim:
        for request in (CHAT, {**CHAT, "tools": TOOLS}):
            result = await tokenize(sim, request)
            assert result["count"] == len(result["tokens"]) == await chat_prompt_tokens(sim, request)
        text = await detokenize(sim, (await tokenize(sim, CHAT))["tokens"])
        bare = await detokenize(sim, (await tokenize(sim, {**CHAT, "add_generation_prompt": False}))["tokens"])
    assert text == bare + "<|im_start|>assistant\n"


# --- a real (test-built) tokenizer with its own chat template -----------------------------------------


async def test_chat_form_renders_the_models_template(autojump_clock: MockClock, model_dir: Path) -> None:
    """The Llama 3 template's text, with its BOS, then tokens: the same count as the chat
    completion's prompt, and the text back from /detokenize."""
    async with llama(model_dir) as sim:
        result = await tokenize(sim, CHAT)
        assert result["count"] == await chat_prompt_tokens(sim, CHAT)
        text = await detokenize(sim, result["tokens"])
        strings = (await tokenize(sim, {**CHAT, "return_token_strs": True}))["token_strs"]
    expected = BOS + HEADER.format("system") + "Be brief.<|eot_id|>" + HEADER.format("user")
    assert text == expected + "Hello there<|eot_id|>" + HEADER.format("assistant")
    assert strings[:2] == [BOS, "<|start_header_id|>"]
    assert result["tokens"][1] != 0  # the chat form adds no second BOS by default (add_special_tokens=false)


async def test_add_special_tokens_is_the_tokenizers_post_processor(autojump_clock: MockClock, model_dir: Path) -> None:
    """Completion form: true by default (a BOS first); chat form: false by default, and
    true adds a BOS on top of the template's (protocol.py:27-33, 75-84)."""
    async with llama(model_dir) as sim:
        default = (await tokenize(sim, {"prompt": "Hello there"}))["tokens"]
        without = (await tokenize(sim, {"prompt": "Hello there", "add_special_tokens": False}))["tokens"]
        chat = (await tokenize(sim, {**CHAT, "add_special_tokens": True}))["tokens"]
        strings = (await tokenize(sim, {"prompt": "Hello there", "return_token_strs": True}))["token_strs"]
    assert default == [0, *without]
    assert chat[:2] == [0, 0]
    assert strings[0] == BOS and "Ġthere" in strings  # vocabulary strings, as convert_ids_to_tokens


@pytest.mark.parametrize("text", ["Hello there, world!", "émoji 🙂 and 漢字", " leading and trailing "])
async def test_round_trip_on_a_real_tokenizer(autojump_clock: MockClock, model_dir: Path, text: str) -> None:
    async with llama(model_dir) as sim:
        tokens = (await tokenize(sim, {"prompt": text, "add_special_tokens": False}))["tokens"]
        assert await detokenize(sim, tokens) == text
        assert await detokenize(sim, [0, *tokens]) == BOS + text


async def test_continue_final_message(autojump_clock: MockClock, model_dir: Path) -> None:
    """The final assistant message left open (the template trims it, so transformers
    strips the cut too); with the default ``add_generation_prompt`` it is transformers'
    refusal, a 400 (vllm/renderers/hf.py:916-926)."""
    request = {"messages": [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two, "}]}
    async with llama(model_dir) as sim:
        result = await tokenize(sim, {**request, "continue_final_message": True, "add_generation_prompt": False})
        text = await detokenize(sim, result["tokens"])
        refused = await post(sim, "/tokenize", {**request, "continue_final_message": True})
    assert text == BOS + HEADER.format("user") + "Count<|eot_id|>" + HEADER.format("assistant") + "One, two,"
    assert refused.status == 400
    assert body(refused)["error"]["message"].startswith("continue_final_message and add_generation_prompt are not")


async def test_ids_the_tokenizer_does_not_know_are_skipped(autojump_clock: MockClock, model_dir: Path) -> None:
    """vLLM decodes without a vocabulary check: the ``tokenizers`` library skips unknown
    ids (serving.py:157-163; vllm/renderers/base.py:684-695)."""
    async with llama(model_dir) as sim:
        tokens = (await tokenize(sim, {"prompt": "Hello", "add_special_tokens": False}))["tokens"]
        vocab = sim.ctx.tokenizer.vocab_size
        assert await detokenize(sim, [vocab, *tokens, 2**32 - 1]) == "Hello"


async def test_template_refusal_is_a_400_and_the_server_keeps_serving(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    """``raise_exception`` in the template: vLLM's ``VLLMValidationError`` with the
    template's reason and no param (vllm/renderers/hf.py:916-926), on /tokenize and on
    chat completions alike."""
    model = build_tokenizer_dir(tmp_path / "gemma", template=ALTERNATING)
    request = {"messages": [{"role": "assistant", "content": "Hi"}]}
    async with running(tokenizer=str(model)) as sim:
        refusals = [await post(sim, "/tokenize", request), await post(sim, "/v1/chat/completions", request)]
        after = await post(sim, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
    expected = (
        b'{"error":{"message":"Conversation roles must alternate user/assistant/user/assistant/...",'
        b'"type":"BadRequestError","param":null,"code":400}}'
    )
    assert [(r.status, r.body) for r in refusals] == [(400, expected), (400, expected)]
    assert after.status == 200


def test_a_broken_template_stops_the_start_with_one_line(tmp_path: Path) -> None:
    model = build_tokenizer_dir(tmp_path / "broken", template="{% for %}")
    with pytest.raises(ConfigError) as caught:
        make_simulator(tokenizer=str(model))
    message = str(caught.value)
    assert message.startswith("invalid configuration: tokenizer: chat template ") and "\n" not in message


# --- bad input ------------------------------------------------------------------------------------------


def validation(*errors: str, param: str) -> bytes:
    """vLLM's rendering of a ``RequestValidationError`` (handlers/validation.py:149-196)."""
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "\n".join(f"  {error}" for error in errors)
    return orjson.dumps({"error": {"message": message, "type": "Bad Request", "param": param, "code": 400}})


def bad_request(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}})


MISSING_BOTH = validation(
    "{'type': 'missing', 'loc': 'body.prompt', 'msg': 'Field required', 'input': '<dict of 1 items>'}",
    "{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', 'input': '<dict of 1 items>'}",
    param="body.prompt",
)


@pytest.mark.parametrize(
    ("path", "request_body", "status", "expected"),
    [
        # pydantic's smart union: every branch's errors, the union markers cleaned from loc
        # (validation.py:125-146; checked against pydantic 2 with OpenAIBaseModel's wrap validator)
        ("/tokenize", {"model": "llmsim/sim-model"}, 400, MISSING_BOTH),
        (
            "/tokenize",
            {"prompt": 5},
            400,
            validation(
                "{'type': 'string_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid string', 'input': '5'}",
                "{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', 'input': '<dict of 1 items>'}",
                param="body.prompt",
            ),
        ),
        # protocol.py:118-129: a VLLMValidationError, which escapes pydantic
        (
            "/tokenize",
            {"prompt": "x", "continue_final_message": True, "add_generation_prompt": True},
            400,
            bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True."),
        ),
        # vllm/renderers/online_renderer.py:692-711, without --trust-request-chat-template
        (
            "/tokenize",
            {**CHAT, "chat_template": "{{ messages }}"},
            400,
            bad_request(
                "Chat template is passed with request, but --trust-request-chat-template is not set. "
                "Refused request with untrusted chat template."
            ),
        ),
        (
            "/tokenize",
            {**CHAT, "chat_template_kwargs": {"chat_template": "x"}},
            400,
            bad_request(
                "Chat template is passed with request, but --trust-request-chat-template is not set. "
                "Refused request with untrusted chat template."
            ),
        ),
        # _check_model (vllm/entrypoints/serve/engine/serving.py:49-84)
        (
            "/tokenize",
            {"prompt": "x", "model": "nope"},
            404,
            orjson.dumps(
                {
                    "error": {
                        "message": "The model `nope` does not exist. Valid aliases: llmsim/sim-model.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                }
            ),
        ),
        (
            "/detokenize",
            {"tokens": [-1, 5, -3]},
            400,
            validation(
                "{'type': 'greater_than_equal', 'loc': 'body.tokens.0', 'msg': 'Input should be greater than or equal"
                " to 0', 'input': '-1', 'ctx': {'ge': 0}}",
                "{'type': 'greater_than_equal', 'loc': 'body.tokens.2', 'msg': 'Input should be greater than or equal"
                " to 0', 'input': '-3', 'ctx': {'ge': 0}}",
                param="body.tokens.0",
            ),
        ),
        (
            "/detokenize",
            {"tokens": [2**63]},
            400,
            validation(
                "{'type': 'less_than_equal', 'loc': 'body.tokens.0', 'msg': 'Input should be less than or equal to "
                "9223372036854775807', 'input': '9223372036854775808', 'ctx': {'le': 9223372036854775807}}",
                param="body.tokens.0",
            ),
        ),
        # an id past u32: the tokenizers library's OverflowError, a 400 (error_response.py:81-85)
        ("/detokenize", {"tokens": [1, 2**40]}, 400, bad_request("number too large to fit in target type")),
        (
            "/detokenize",
            {"tokens": "1 2"},
            400,
            validation(
                "{'type': 'list_type', 'loc': 'body.tokens', 'msg': 'Input should be a valid list', 'input': '1 2'}",
                param="body.tokens",
            ),
        ),
        (
            "/detokenize",
            {"tokens": [1.5]},
            400,
            validation(
                "{'type': 'int_from_float', 'loc': 'body.tokens.0', 'msg': 'Input should be a valid integer, got a "
                "number with a fractional part', 'input': '1.5'}",
                param="body.tokens.0",
            ),
        ),
    ],
)
async def test_bad_input_is_vllms_4xx(
    autojump_clock: MockClock, path: str, request_body: dict[str, Any], status: int, expected: bytes
) -> None:
    async with running() as sim:
        response = await post(sim, path, request_body)
        after = await post(sim, "/tokenize", {"prompt": "still serving"})
    assert (response.status, response.body) == (status, expected)
    assert after.status == 200


@pytest.mark.parametrize(
    "request_body",
    [
        {"messages": "hi"},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        {"messages": [{"role": "user", "content": 5}]},
        {**CHAT, "tools": [{"type": "function"}]},
        {**CHAT, "chat_template_kwargs": [1]},
        {**CHAT, "return_token_strs": "maybe"},
        {"prompt": ["a", "b"]},
        {"tokens": None},
    ],
)
async def test_other_malformed_bodies_are_400s(autojump_clock: MockClock, request_body: dict[str, Any]) -> None:
    async with running() as sim:
        for path in ("/tokenize", "/detokenize"):
            response = await post(sim, path, request_body)
            assert response.status == 400, (path, response.body)
            assert body(response)["error"]["code"] == 400


async def test_chat_completions_read_the_same_template_fields(autojump_clock: MockClock, model_dir: Path) -> None:
    """Chat completions take vLLM's ``add_generation_prompt``, ``continue_final_message``,
    ``add_special_tokens`` and ``chat_template_kwargs`` too
    (vllm/entrypoints/openai/chat_completion/protocol.py:332-385, 643-677), so a
    continued message or an extra BOS counts as /tokenize counts it; the same refusals."""
    request = {
        "messages": [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two,"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    async with llama(model_dir) as sim:
        for variant in (request, {**request, "add_special_tokens": True}, {**CHAT, "chat_template_kwargs": {"x": 1}}):
            assert await chat_prompt_tokens(sim, variant) == (await tokenize(sim, variant))["count"]
        continued = {key: value for key, value in request.items() if key != "add_generation_prompt"}
        refusals = [
            await post(sim, "/v1/chat/completions", {**CHAT, "chat_template": "{{ messages }}"}),
            await post(sim, "/v1/chat/completions", {**request, "add_generation_prompt": True}),
            await post(sim, "/v1/chat/completions", continued),  # add_generation_prompt defaults to true
        ]
    assert [r.status for r in refusals] == [400, 400, 400]
    assert body(refusals[0])["error"]["message"].startswith("Chat template is passed with request")
    assert refusals[1].body == bad_request(
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    )
    assert body(refusals[2])["error"]["message"].startswith("continue_final_message and add_generation_prompt")


async def test_messages_reach_the_template_in_vllms_form(autojump_clock: MockClock, tmp_path: Path) -> None:
    """A template that loops over content parts gets parts (``openai`` format, an image
    part as ``{"type": "image"}``); one that never names ``developer`` gets it as a
    system message merged into the first (vllm/renderers/hf.py:600-672)."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]}
    vision = build_tokenizer_dir(tmp_path / "vision", template=VISION)
    async with running(tokenizer=str(vision)) as sim:
        text = await detokenize(sim, (await tokenize(sim, parts))["tokens"])
    assert text == HEADER.format("user") + "What is this?<|image|><|eot_id|>" + HEADER.format("assistant")
    developer = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "developer", "content": "Be brief."},
            {"role": "system", "content": "Be kind."},
        ],
        "add_generation_prompt": False,
    }
    async with running(tokenizer=str(build_tokenizer_dir(tmp_path / "llama"))) as sim:
        text = await detokenize(sim, (await tokenize(sim, developer))["tokens"])
    assert (
        text
        == BOS + HEADER.format("system") + "Be brief.\n\nBe kind.<|eot_id|>" + HEADER.format("user") + "Hi<|eot_id|>"
    )


async def test_completions_count_the_bos_as_tokenize_does(autojump_clock: MockClock, model_dir: Path) -> None:
    """/v1/completions tokenizes text with ``add_special_tokens`` true, vLLM's default
    (vllm/entrypoints/openai/completion/protocol.py:118-124): its prompt counts the BOS
    that /tokenize's completion form counts."""
    async with llama(model_dir) as sim:
        response = await post(sim, "/v1/completions", {"prompt": "Hello there", "max_tokens": 1})
        tokens = (await tokenize(sim, {"prompt": "Hello there"}))["tokens"]
    assert tokens[0] == 0
    assert body(response)["usage"]["prompt_tokens"] == len(tokens)
