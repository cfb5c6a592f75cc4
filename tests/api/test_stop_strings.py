"""``stop``, ``stop_token_ids`` and ``include_stop_str_in_output`` on chat and
completions, as vLLM 0.33.0's detokenizer and output processor apply them.

* vllm/v1/engine/detokenizer.py:96-155 — one token at a time, the token completing a
  stop string (looked for only from token ``min_tokens`` on, :134-136) ends the
  request; the text is cut before the string (after it with
  ``include_stop_str_in_output``), and that token counts.
* detokenizer.py:321-373 (``check_stop_strings``) — the string that completes earliest
  wins, ties go to the first listed.
* vllm/v1/engine/output_processor.py:823-830 — ``finish_reason`` ``stop``,
  ``stop_reason`` the string; vllm/v1/core/sched/utils.py:109-112 — a stop token id
  ends it with ``stop_reason`` the id, its text left out (detokenizer.py:107-113).
* detokenizer.py:85-90, 157-176 — a stream holds back ``max(len(stop)) - 1``
  characters until the request finishes; the finishing chunk carries the rest.

The seeded simulator (``--seed 7``, ``X-Request-Id: stop-1``) says, on /v1/completions
with ``ignore_eos`` and 12 tokens, ``The simulator is running and every token arrives
right on time. `` (one token per word), and on /v1/chat/completions ``Write the ``
then its EOS: the stop strings below are known to occur there.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import hypothesis
import orjson
import pytest
from hypothesis import strategies as st
from trio.testing import MockClock

from llmsim.api.context import ApiContext
from llmsim.api.stops import StopRule, finish_turn, hold_back, stop_turn
from llmsim.api.turns import TEXT, TOOL_CALL, Block, TurnPlan
from llmsim.model.text import EosToken
from tests.api.fakes import post, running

HEADERS = ((b"x-request-id", b"stop-1"),)
PROMPT = {"prompt": "hi", "max_tokens": 12, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "hi"}]
FINGERPRINT = "vllm-0.33.0-384992da"


async def completion(**fields: Any) -> tuple[int, bytes]:
    async with running() as sim:
        response = await post(sim, "/v1/completions", {**PROMPT, **fields}, HEADERS)
    return response.status, response.body


async def chat(**fields: Any) -> tuple[int, bytes]:
    async with running() as sim:
        body = {"messages": MESSAGES, "max_tokens": 12, **fields}
        response = await post(sim, "/v1/chat/completions", body, HEADERS)
    return response.status, response.body


def completion_body(text: str, finish: str, stop_reason: object, tokens: int) -> bytes:
    """vLLM's ``CompletionResponse`` (vllm/entrypoints/openai/completion/protocol.py:674-725)."""
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
        "weight_versions": None,
    }
    return orjson.dumps(
        {
            "id": "cmpl-stop-1",
            "object": "text_completion",
            "created": 1700000000,
            "model": "llmsim/sim-model",
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": {
                "prompt_tokens": 1,
                "total_tokens": 1 + tokens,
                "completion_tokens": tokens,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


def completion_chunk(text: str, finish: str | None = None, stop_reason: object = None) -> bytes:
    """A completions chunk (vllm/entrypoints/openai/completion/serving.py:437-486); the
    finishing one carries ``stop_reason`` and, without usage, the fingerprint."""
    fingerprint = b"" if finish is None else b',"system_fingerprint":"%s"' % FINGERPRINT.encode()
    return (
        b'data: {"id":"cmpl-stop-1","object":"text_completion","created":1700000000,"model":"llmsim/sim-model",'
        b'"choices":[{"index":0,"text":' + orjson.dumps(text) + b',"logprobs":null,"finish_reason":'
        b"" + orjson.dumps(finish) + b',"stop_reason":' + orjson.dumps(stop_reason) + b',"prompt_token_ids":null,'
        b'"token_ids":null,"weight_versions":null}]' + fingerprint + b',"kv_transfer_params":null}\n\n'
    )


async def test_a_stop_string_cuts_the_text_before_it_and_names_itself(autojump_clock: MockClock) -> None:
    """ "running" is completed by the 4th token: 4 tokens count, the text stops before it."""
    assert await completion(stop=["y tok", "running"]) == (
        200,
        completion_body("The simulator is ", "stop", "running", 4),
    )


async def test_a_stop_string_spanning_tokens_counts_the_token_that_completes_it(autojump_clock: MockClock) -> None:
    """ "y tok" starts in "every " and ends in "token ": that 7th token counts
    (detokenizer.py:144-151 keeps it) and the text ends before "y tok"."""
    assert await completion(stop="y tok") == (
        200,
        completion_body("The simulator is running and ever", "stop", "y tok", 7),
    )


async def test_include_stop_str_in_output_keeps_the_string_and_drops_the_rest_of_its_token(
    autojump_clock: MockClock,
) -> None:
    """The text is cut at the end of the stop string (detokenizer.py:364-369): "token "
    loses its "en "."""
    expected = completion_body("The simulator is running and every tok", "stop", "y tok", 7)
    assert await completion(stop=["y tok"], include_stop_str_in_output=True) == (200, expected)


async def test_the_earliest_ending_stop_string_wins_whatever_its_place_in_the_list(autojump_clock: MockClock) -> None:
    """ "every token" begins before "token" but ends with it, after "every": "every" wins."""
    expected = completion_body("The simulator is running and ", "stop", "every", 6)
    assert await completion(stop=["token", "every token", "every"]) == (200, expected)


async def test_a_stop_string_inside_min_tokens_is_not_looked_for(autojump_clock: MockClock) -> None:
    """Stop strings are checked once more than ``min_tokens`` tokens exist
    (detokenizer.py:134-136): "running" (token 4) is skipped with min_tokens 4 and
    found with min_tokens 3."""
    full = completion_body("The simulator is running and every token arrives right on time. ", "length", None, 12)
    assert await completion(stop="running", min_tokens=4) == (200, full)
    assert await completion(stop="running", min_tokens=3) == (
        200,
        completion_body("The simulator is ", "stop", "running", 4),
    )


async def test_a_stop_token_id_ends_the_text_before_its_token(autojump_clock: MockClock) -> None:
    """Token 4 ("running ") is a stop token: it counts, its text is left out, and
    ``stop_reason`` is the id (an integer); with include_stop_str_in_output its text stays."""
    async with running() as sim:
        running_id = sim.ctx.tokenizer.encode("The simulator is running ")[3]
    assert await completion(stop_token_ids=[running_id]) == (
        200,
        completion_body("The simulator is ", "stop", running_id, 4),
    )
    assert await completion(stop_token_ids=[running_id], include_stop_str_in_output=True) == (
        200,
        completion_body("The simulator is running ", "stop", running_id, 4),
    )


async def test_a_completions_stream_holds_back_what_could_start_a_stop_string(autojump_clock: MockClock) -> None:
    """With "y tok" (5 characters) each chunk holds back the last 4 characters of the
    text so far (as it was before the cut: "every " lets "and ev" out); the first token's
    chunk is empty and still sent (completion/serving.py:393-400 skips only a chunk
    without tokens); the finishing chunk sends the rest of the cut text."""
    status, body = await completion(stop=["y tok"], stream=True)
    texts = ["", "The simula", "tor", " is runn", "ing ", "and ev"]
    expected = b"".join(completion_chunk(text) for text in texts)
    expected += completion_chunk("er", "stop", "y tok") + b"data: [DONE]\n\n"
    assert (status, body) == (200, expected)


async def test_a_stream_whose_stop_string_never_comes_sends_the_held_back_text_last(
    autojump_clock: MockClock,
) -> None:
    """No "zz" in the text: every chunk lags one character; the last (``length``) one
    carries the held-back character with its own."""
    status, body = await completion(stop="zz", stream=True, max_tokens=3)
    expected = completion_chunk("The") + completion_chunk(" simulator") + completion_chunk(" is ", "length")
    assert (status, body) == (200, expected + b"data: [DONE]\n\n")


async def test_a_chat_stream_ends_on_its_eos_chunk_with_the_held_back_text(autojump_clock: MockClock) -> None:
    """Chat says "Write the " then its EOS; with a 3-character stop string that never
    matches, the EOS chunk (finished, so nothing held back) carries the last 2
    characters, and ``stop_reason`` stays null (chat_completion/serving.py:796-809)."""
    status, body = await chat(stop="ent", stream=True, stream_options={"include_usage": True})
    head = (
        b'data: {"id":"chatcmpl-stop-1","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"llmsim/sim-model","choices":[{"index":0,'
    )
    token_end = b'},"logprobs":null,"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}\n\n'
    expected = (
        head + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
        b'"prompt_token_ids":null,"prompt_text":null}\n\n'
        + head + b'"delta":{"content":"Writ"' + token_end
        + head + b'"delta":{"content":"e th"' + token_end
        + head + b'"delta":{"content":"e "},"logprobs":null,"finish_reason":"stop","stop_reason":null,'
        b'"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
        b'data: {"id":"chatcmpl-stop-1","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"llmsim/sim-model","choices":[],"usage":{"prompt_tokens":7,"total_tokens":10,'
        b'"completion_tokens":3},"system_fingerprint":"' + FINGERPRINT.encode() + b'"}\n\n'
        b"data: [DONE]\n\n"
    )  # fmt: skip
    assert (status, body) == (200, expected)


async def test_a_chat_stop_string_ends_the_turn_without_its_eos(autojump_clock: MockClock) -> None:
    """ "the" is completed by the 2nd token: 2 tokens count (no EOS follows a stop
    string), the content is "Write ", ``stop_reason`` "the"."""
    status, body = await chat(stop=["the"])
    choice = orjson.loads(body)["choices"][0]
    assert status == 200
    assert (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]) == ("Write ", "stop", "the")
    assert orjson.loads(body)["usage"]["completion_tokens"] == 2


async def test_a_chat_stream_stop_chunk_names_the_stop_string(autojump_clock: MockClock) -> None:
    status, body = await chat(stop=["the"], stream=True)
    assert status == 200
    assert body.endswith(
        b'"delta":{"content":"e "},"logprobs":null,"finish_reason":"stop","stop_reason":"the","token_ids":null,'
        b'"weight_versions":null}],"system_fingerprint":"' + FINGERPRINT.encode() + b'","kv_transfer_params":null}\n\n'
        b"data: [DONE]\n\n"
    )


async def test_a_stream_with_logprobs_holds_back_its_text_and_names_whole_tokens(autojump_clock: MockClock) -> None:
    """With logprobs the text still lags (held back for "zz"), while each chunk's logprobs
    name its whole token, decoded from its id (generate/base/serving.py:302-319), and
    ``text_offset`` advances by the tokens reported, not by the text sent
    (completion/serving.py:413-418)."""
    status, body = await completion(stop="zz", stream=True, max_tokens=2, logprobs=0)
    chunks = [orjson.loads(event[6:])["choices"][0] for event in body.split(b"\n\n")[:-2]]
    assert status == 200
    assert [chunk["text"] for chunk in chunks] == ["The", " simulator "]
    assert [chunk["logprobs"]["tokens"] for chunk in chunks] == [["The "], ["simulator "]]
    assert [chunk["logprobs"]["text_offset"] for chunk in chunks] == [[0], [4]]
    assert [list(chunk["logprobs"]["top_logprobs"][0]) for chunk in chunks] == [["The "], ["simulator "]]


async def test_logprobs_name_the_whole_token_that_completed_a_stop_string(autojump_clock: MockClock) -> None:
    """The text is cut inside "every " and "token " is gone, but both tokens count and
    their logprobs name them whole, offsets running over the tokens."""
    status, body = await completion(stop=["y tok"], logprobs=0)
    choice = orjson.loads(body)["choices"][0]
    assert (status, choice["text"], choice["stop_reason"]) == (200, "The simulator is running and ever", "y tok")
    tokens = ["The ", "simulator ", "is ", "running ", "and ", "every ", "token "]
    assert choice["logprobs"]["tokens"] == tokens
    assert choice["logprobs"]["text_offset"] == [0, 4, 14, 17, 25, 29, 35]


async def test_a_chat_stream_with_logprobs_lags_its_text_not_its_tokens(autojump_clock: MockClock) -> None:
    """Chat sends a chunk per token with its logprobs even when the text is held back
    (chat_completion/serving.py:686-700, stream_processor.py:91-92): "Write " shows as
    "Writ", and the token completing "the" shows the text before the string ("e ") and
    its logprobs the token, "the "."""
    status, body = await chat(stop=["the"], logprobs=True, stream=True)
    chunks = [orjson.loads(event[6:])["choices"][0] for event in body.split(b"\n\n")[1:-2]]
    assert status == 200
    assert [chunk["delta"]["content"] for chunk in chunks] == ["Writ", "e "]
    assert [chunk["logprobs"]["content"][0]["token"] for chunk in chunks] == ["Write ", "the "]
    assert chunks[1]["logprobs"]["content"][0]["bytes"] == list(b"the ")


# --- the planning rules, on plans built by hand -----------------------------------------


def text_turn(*pieces: str, finish: str = "length") -> TurnPlan:
    return TurnPlan(pieces, tuple(range(10, 10 + len(pieces))), finish, (Block(TEXT, 0, len(pieces)),))


@pytest.mark.parametrize(
    ("strings", "pieces", "reason"),
    [
        (("bcd", "c"), ("ab", ""), "c"),  # "c" ends first (at 3), "bcd" at 4 (it would leave "a")
        (("abcd", "bcd"), ("", ""), "abcd"),  # both end at 4: the first listed
        (("cd", "d"), ("ab", ""), "cd"),  # both end at 4: the first listed, cut at its start
    ],
)
def test_check_stop_strings_order(strings: tuple[str, ...], pieces: tuple[str, ...], reason: str) -> None:
    """detokenizer.py:345-361: the earliest end wins, ties by list order."""
    turn = stop_turn(text_turn("ab", "cd", "ef"), StopRule(strings))
    assert (turn.pieces, turn.token_ids, turn.finish_reason, turn.stop_reason) == (pieces, (10, 11), "stop", reason)
    assert turn.token_texts == ("ab", "cd")  # logprobs name the tokens whole


def test_a_stop_tokens_logprobs_name_its_text_though_the_text_leaves_it_out() -> None:
    turn = stop_turn(text_turn("ab", "cd", "ef"), StopRule(token_ids=frozenset({11})))
    assert (turn.pieces, turn.token_texts, turn.stop_reason) == (("ab", ""), ("ab", "cd"), 11)


def test_a_turn_of_tool_calls_is_not_cut() -> None:
    turn = TurnPlan(("{}",), (1,), "tool_calls", (Block(TOOL_CALL, 0, 1, "f", "id"),))
    assert stop_turn(turn, StopRule(("{",), frozenset({1}))) is turn


def test_hold_back_spreads_the_text_and_keeps_the_token_count() -> None:
    turn = hold_back(text_turn("abc", "de", "f", ""), 2)
    assert turn.pieces == ("a", "bc", "d", "ef")
    assert turn.token_texts == ("abc", "de", "f", "")
    assert hold_back(turn, 0) is turn


# --- against vLLM's own algorithm --------------------------------------------------------


def vllm_stream(
    pieces: list[str], ids: list[int], stop: StopRule, finish: str
) -> tuple[list[str], int, str, str | int | None]:
    """vLLM 0.33.0's detokenizer fed one token per step, ported line for line
    (vllm/v1/engine/detokenizer.py:96-176, check_stop_strings :321-373, the stop-token
    check of vllm/v1/core/sched/utils.py:109-112): each step's streamed delta, the
    tokens kept, the finish reason and the stop reason."""
    buffer = max(map(len, stop.strings)) - 1 if stop.strings and not stop.include_in_output else 0
    output_text, token_count, last_offset, deltas = "", 0, 0, []
    finish_reason: str = finish
    stop_reason: str | int | None = None
    for k, (piece, token_id) in enumerate(zip(pieces, ids, strict=True)):
        eos = token_id == 99  # the EOS: checked before the stop tokens, no stop_reason
        stop_terminated = eos or (k >= stop.min_tokens and token_id in stop.token_ids)
        finished = stop_terminated or k == len(pieces) - 1
        if stop_terminated:
            finish_reason, stop_reason = "stop", None if eos else token_id
        offsets = [len(output_text)]
        if not stop_terminated or stop.include_in_output:
            output_text += piece
        token_count += 1
        offsets.append(len(output_text))
        if stop.strings and token_count > stop.min_tokens:
            new_chars = len(output_text) - offsets[max(stop.min_tokens - k, 0)]
            best, best_index, best_end = None, 0, 1 << 62
            for string in stop.strings if new_chars else ():
                index = output_text.find(string, 1 - new_chars - len(string))
                if index != -1 and index + len(string) < best_end:
                    best, best_index, best_end = string, index, index + len(string)
            if best is not None:
                finished, finish_reason, stop_reason = True, "stop", best
                output_text = output_text[: best_end if stop.include_in_output else best_index]
        length = len(output_text) - (0 if finished else buffer)
        deltas.append(output_text[last_offset:length] if last_offset < length else "")
        last_offset = max(last_offset, length)
        if finished:
            break
    return deltas, token_count, finish_reason, stop_reason


#: What :func:`finish_turn` reads of the context: the EOS token (id 99, outside the drawn ids).
EOS_CONTEXT = cast(ApiContext, SimpleNamespace(text=SimpleNamespace(eos=EosToken(99, "<|im_end|>"))))


@hypothesis.given(
    pieces=st.lists(st.text("abc", max_size=3), min_size=1, max_size=8),
    strings=st.lists(st.text("abc", min_size=1, max_size=3), max_size=3),
    stop_ids=st.frozensets(st.integers(10, 17), max_size=2),
    include=st.booleans(),
    min_tokens=st.integers(0, 3),
    natural=st.booleans(),
)
def test_planned_stops_match_vllms_detokenizer(
    pieces: list[str], strings: list[str], stop_ids: frozenset[int], include: bool, min_tokens: int, natural: bool
) -> None:
    """Whatever the text and the stop rule, a streamed turn's pieces are vLLM's deltas
    step by step; a turn the model ends itself (``natural``) has its EOS step last, a
    stop token with empty text (vllm/v1/core/sched/utils.py:105-107)."""
    rule = StopRule(tuple(strings), stop_ids, include, min_tokens, streaming=True)
    finish = "stop" if natural else "length"
    turn = finish_turn(EOS_CONTEXT, text_turn(*pieces, finish=finish), len(pieces) + 1, rule)
    ids = list(range(10, 10 + len(pieces)))
    if natural:
        pieces, ids = [*pieces, ""], [*ids, 99]
    deltas, count, finish, reason = vllm_stream(pieces, ids, rule, finish)
    assert (list(turn.pieces), len(turn.token_ids), turn.finish_reason, turn.stop_reason) == (
        deltas,
        count,
        finish,
        reason,
    )
