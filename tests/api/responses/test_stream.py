"""Golden bytes of /v1/responses streams: renderer + sink driven by a real Engine with
explicit times (TTFT 100 ms, ITL 10 ms), no server."""

from __future__ import annotations

import orjson

from llmsim.api.errors import ApiError
from llmsim.api.generation import StreamingSink
from llmsim.api.responses.render import (
    ResponseShell,
    ResponsesStreamRenderer,
    TokenLogprobs,
    TurnIds,
)
from llmsim.api.turns import TEXT, TOOL_CALL, Block, TurnPlan
from tests.api.fakes import EngineRun, turn_job

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
SHELL = ResponseShell(response_id="resp_1", created_at=1, model="m", max_output_tokens=16)
IDS = TurnIds("msg_1", "fc_1", "call_1")
# vLLM's ResponsesResponse keys in order (vllm/entrypoints/openai/responses/protocol.py:870-1033):
# no error/completed_at/store; text and top_logprobs null when the request has neither.
MIDDLE = (
    b'"max_output_tokens":16,"max_tool_calls":null,"previous_response_id":null,"prompt":null,'
    b'"prompt_cache_options":null,"prompt_cache_key":null,"prompt_cache_retention":null,"reasoning":null,'
    b'"safety_identifier":null,"service_tier":"auto",'
)
TAIL = (
    b'"presence_penalty":0.0,"frequency_penalty":0.0,"kv_transfer_params":null,"ec_transfer_params":null,'
    b'"input_messages":null,"output_messages":null}'
)
# vllm/entrypoints/openai/responses/protocol.py:98-117
USAGE = (
    b'{"input_tokens":3,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0,"input_tokens_per_turn":[],'
    b'"cached_tokens_per_turn":[]},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0,'
    b'"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":5}'
)
# The response object of response.created / response.in_progress.
IN_PROGRESS = (
    b'{"id":"resp_1","created_at":1,"incomplete_details":null,"instructions":null,"metadata":null,'
    b'"model":"m","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto",'
    b'"tools":[],"top_p":1.0,"background":false,' + MIDDLE + b'"status":"in_progress",'
    b'"text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,' + TAIL
)
HEAD = (
    b'event: response.created\ndata: {"response":'
    + IN_PROGRESS
    + b',"sequence_number":0,"type":"response.created"}\n\n'
    b'event: response.in_progress\ndata: {"response":'
    + IN_PROGRESS
    + b',"sequence_number":1,"type":"response.in_progress"}\n\n'
)


def run_stream(
    plan: TurnPlan, logprobs: TokenLogprobs | None = None
) -> tuple[EngineRun, ResponsesStreamRenderer, StreamingSink]:
    run = EngineRun(**LATENCY)
    renderer = ResponsesStreamRenderer(shell=SHELL, plan=plan, ids=IDS, logprobs=logprobs)
    sink = run.streaming_sink(renderer, 1)
    job = turn_job(sink, plan, cap=16)
    run.submit([job])
    run.response.write(renderer.head())
    run.run()
    assert sink.ended and run.response.ended
    return run, renderer, sink


def text_plan(*pieces: str, finish: str = "stop") -> TurnPlan:
    return TurnPlan(pieces, tuple(range(10, 10 + len(pieces))), finish, (Block(TEXT, 0, len(pieces)),))


def test_text_turn_exact_bytes() -> None:
    run, renderer, _ = run_stream(text_plan("Hello", " world"))
    final_message = (
        b'{"id":"msg_1","content":[{"annotations":[],"text":"Hello world","type":"output_text","logprobs":null}],'
        b'"role":"assistant","status":"completed","type":"message"}'
    )
    assert run.writes_at() == {
        0.0: HEAD,
        0.1: (
            b"event: response.output_item.added\n"
            b'data: {"item":{"id":"msg_1","content":[],"role":"assistant","status":"in_progress","type":"message"},'
            b'"output_index":0,"sequence_number":2,"type":"response.output_item.added"}\n\n'
            b"event: response.content_part.added\n"
            b'data: {"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"",'
            b'"type":"output_text","logprobs":[]},"sequence_number":3,"type":"response.content_part.added"}\n\n'
            b"event: response.output_text.delta\n"
            b'data: {"content_index":0,"delta":"Hello","item_id":"msg_1","logprobs":[],"output_index":0,'
            b'"sequence_number":4,"type":"response.output_text.delta"}\n\n'
        ),
        0.11: (
            b"event: response.output_text.delta\n"
            b'data: {"content_index":0,"delta":" world","item_id":"msg_1","logprobs":[],"output_index":0,'
            b'"sequence_number":5,"type":"response.output_text.delta"}\n\n'
            b"event: response.output_text.done\n"
            b'data: {"content_index":0,"item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":6,'
            b'"text":"Hello world","type":"response.output_text.done"}\n\n'
            b"event: response.content_part.done\n"
            b'data: {"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],'
            b'"text":"Hello world","type":"output_text","logprobs":null},"sequence_number":7,'
            b'"type":"response.content_part.done"}\n\n'
            b"event: response.output_item.done\n"
            b'data: {"item":' + final_message + b',"output_index":0,"sequence_number":8,'
            b'"type":"response.output_item.done"}\n\n'
            b"event: response.completed\n"
            b'data: {"response":{"id":"resp_1","created_at":1,"incomplete_details":null,'
            b'"instructions":null,"metadata":null,"model":"m","object":"response","output":['
            + final_message
            + b'],"parallel_tool_calls":true,'
            b'"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,'
            + MIDDLE
            + b'"status":"completed","text":null,"top_logprobs":null,"truncation":"disabled","usage":'
            + USAGE
            + b',"user":null,'
            + TAIL
            + b',"sequence_number":9,"type":"response.completed"}\n\n'
        ),
    }
    assert renderer.final is not None and renderer.final["status"] == "completed"


def test_a_turn_cut_by_max_output_tokens_ends_with_response_incomplete_exact_bytes() -> None:
    # vLLM 0.33: finish "length" makes the item and the response "incomplete", with
    # incomplete_details.reason "max_output_tokens", and the last event is
    # response.incomplete (vllm/entrypoints/openai/responses/serving.py:857-859,1442-1456;
    # protocol.py:982-984; utils.py:103-107)
    run, renderer, _ = run_stream(text_plan("Hello", " world", finish="length"))
    final_message = (
        b'{"id":"msg_1","content":[{"annotations":[],"text":"Hello world","type":"output_text","logprobs":null}],'
        b'"role":"assistant","status":"incomplete","type":"message"}'
    )
    end = run.writes_at()[0.11]
    assert end.endswith(
        b'data: {"item":' + final_message + b',"output_index":0,"sequence_number":8,'
        b'"type":"response.output_item.done"}\n\n'
        b"event: response.incomplete\n"
        b'data: {"response":{"id":"resp_1","created_at":1,'
        b'"incomplete_details":{"reason":"max_output_tokens"},'
        b'"instructions":null,"metadata":null,"model":"m","object":"response","output":['
        + final_message
        + b'],"parallel_tool_calls":true,'
        b'"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,'
        + MIDDLE
        + b'"status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":'
        + USAGE
        + b',"user":null,'
        + TAIL
        + b',"sequence_number":9,"type":"response.incomplete"}\n\n'
    )
    assert b"response.completed" not in run.response.body
    assert renderer.final is not None and renderer.final["status"] == "incomplete"


def test_a_tool_turn_cut_by_max_output_tokens_ends_with_response_incomplete() -> None:
    plan = TurnPlan(('{"', "city"), (1, 2), "length", (Block(TOOL_CALL, 0, 2, "get_weather", "call_1"),))
    run, _, _ = run_stream(plan)
    (kind, last), item_done = events(run.response.body)[-1], events(run.response.body)[-2]
    assert kind == "response.incomplete" and last["response"]["status"] == "incomplete"  # type: ignore[index]
    assert item_done[1]["item"]["status"] == "incomplete"  # type: ignore[index]


def test_tool_turn_exact_bytes() -> None:
    pieces = ('{"', "city", '": "', "Paris", '"}')
    plan = TurnPlan(pieces, (1, 2, 3, 4, 5), "tool_calls", (Block(TOOL_CALL, 0, 5, "get_weather", "call_1"),))
    run, _, _ = run_stream(plan)
    item = (
        b'{"arguments":"{\\"city\\": \\"Paris\\"}","call_id":"call_1","name":"get_weather","type":"function_call",'
        b'"id":"fc_1","status":"completed"}'
    )

    def delta(text: bytes, seq: int) -> bytes:
        return (
            b'event: response.function_call_arguments.delta\ndata: {"delta":"' + text + b'","item_id":"fc_1",'
            b'"output_index":0,"sequence_number":'
            + str(seq).encode()
            + b',"type":"response.function_call_arguments.delta"}\n\n'
        )

    writes = run.writes_at()
    assert writes[0.0] == HEAD
    assert writes[0.1] == (
        b"event: response.output_item.added\n"
        b'data: {"item":{"arguments":"","call_id":"call_1","name":"get_weather","type":"function_call","id":"fc_1",'
        b'"status":"in_progress"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}\n\n'
        + delta(b'{\\"', 3)
    )
    assert writes[0.11] == delta(b"city", 4)
    assert writes[0.12] == delta(b'\\": \\"', 5)
    assert writes[0.13] == delta(b"Paris", 6)
    end = writes[0.14]
    assert end.startswith(
        delta(b'\\"}', 7) + b"event: response.function_call_arguments.done\n"
        b'data: {"arguments":"{\\"city\\": \\"Paris\\"}","item_id":"fc_1","name":"get_weather","output_index":0,'
        b'"sequence_number":8,"type":"response.function_call_arguments.done"}\n\n'
        b"event: response.output_item.done\n"
        b'data: {"item":' + item + b',"output_index":0,"sequence_number":9,"type":"response.output_item.done"}\n\n'
        b"event: response.completed\n"
    )
    completed = orjson.loads(end.split(b"event: response.completed\ndata: ")[1])
    assert completed["sequence_number"] == 10
    assert completed["response"]["output"] == [orjson.loads(item)]
    assert completed["response"]["usage"]["output_tokens"] == 5


def events(body: bytes) -> list[tuple[str, dict[str, object]]]:
    result = []
    for frame in body.split(b"\n\n")[:-1]:
        head, data = frame.split(b"\n", 1)
        assert head.startswith(b"event: ") and data.startswith(b"data: ")
        payload = orjson.loads(data[len(b"data: ") :])
        assert payload["type"] == head[len(b"event: ") :].decode()
        result.append((payload["type"], payload))
    return result


def test_catch_up_steps_keep_sequence_numbers_and_content_index() -> None:
    run = EngineRun(time_to_first_token=0.1, inter_token_latency=0.01)
    plan = text_plan("a ", "b ", "c ", "d ", "e", finish="length")
    renderer = ResponsesStreamRenderer(shell=SHELL, plan=plan, ids=IDS, logprobs=None)
    sink = run.streaming_sink(renderer, 1)
    run.submit([turn_job(sink, plan, cap=5)])
    run.response.write(renderer.head())
    run.step_to(0.1)
    run.step_to(0.5)  # late: every remaining token is due at once
    parsed = events(run.response.body)
    assert [p["sequence_number"] for _, p in parsed] == list(range(len(parsed)))
    assert {p["content_index"] for _, p in parsed if "content_index" in p} == {0}
    assert "".join(str(p["delta"]) for kind, p in parsed if kind == "response.output_text.delta") == "a b c d e"
    assert parsed[-1][0] == "response.incomplete"
    final = parsed[-1][1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}  # type: ignore[index]
    assert final["output"][0]["status"] == "incomplete"  # type: ignore[index]


def test_logprobs_in_deltas_and_final_part_agree() -> None:
    run, _, _ = run_stream(text_plan("Hello", " world", "!"), TokenLogprobs(top_n=2, seed=9, eos="<|im_end|>"))
    parsed = dict(events(run.response.body)[-1:])
    final_part = parsed["response.completed"]["response"]["output"][0]["content"][0]  # type: ignore[index]
    deltas = [p for kind, p in events(run.response.body) if kind == "response.output_text.delta"]
    assert [d["logprobs"][0]["token"] for d in deltas] == ["Hello", " world", "!"]  # type: ignore[index]
    for delta, full in zip(deltas, final_part["logprobs"], strict=True):
        (entry,) = delta["logprobs"]  # type: ignore[misc]
        assert entry["logprob"] == full["logprob"] and len(entry["top_logprobs"]) == 2
        assert full["bytes"] == list(full["token"].encode())
        assert [t["token"] for t in entry["top_logprobs"]] == [t["token"] for t in full["top_logprobs"]]


def test_in_band_error_event_ends_the_stream() -> None:
    run = EngineRun(**LATENCY)
    plan = text_plan("Hello", " world")
    renderer = ResponsesStreamRenderer(shell=SHELL, plan=plan, ids=IDS, logprobs=None)
    sink = run.streaming_sink(renderer, 1)
    run.submit([turn_job(sink, plan, cap=16)])
    run.response.write(renderer.head())
    run.step_to(0.1)
    sink.fail(ApiError(503, "Service unavailable"))
    assert run.response.ended and sink.ended
    assert run.response.writes[-1][1] == (
        b'event: error\ndata: {"type":"error","code":"InternalServerError","message":"Service unavailable",'
        b'"param":null,"sequence_number":5}\n\n'
    )


# --- the EOS token (vLLM 0.33) ----------------------------------------------------------

EOS_ID = 151645


def eos_plan(*pieces: str) -> TurnPlan:
    """A text turn the model ended itself: its text, then its EOS token (``with_eos``)."""
    return TurnPlan((*pieces, ""), (*range(10, 10 + len(pieces)), EOS_ID), "stop", (Block(TEXT, 0, len(pieces)),))


def test_the_eos_token_sends_no_event_and_the_turn_closes_one_itl_later() -> None:
    """vLLM's EOS output has empty text: ``resolve_target_state`` finds no content, so no
    delta and no sequence number (responses/serving.py:1269-1274,
    streaming_events.py:1288-1297); the closing events follow once the engine emitted it,
    one ITL after the last text (serving.py:1283-1284), numbered straight after the last
    delta; ``output_tokens`` counts it (responses/context.py:223)."""
    run, renderer, _ = run_stream(eos_plan("Hello", " world"))
    writes = run.writes_at()
    assert writes[0.11] == (
        b"event: response.output_text.delta\n"
        b'data: {"content_index":0,"delta":" world","item_id":"msg_1","logprobs":[],"output_index":0,'
        b'"sequence_number":5,"type":"response.output_text.delta"}\n\n'
    )
    final_message = (
        b'{"id":"msg_1","content":[{"annotations":[],"text":"Hello world","type":"output_text","logprobs":null}],'
        b'"role":"assistant","status":"completed","type":"message"}'
    )
    assert writes[0.12] == (
        b"event: response.output_text.done\n"
        b'data: {"content_index":0,"item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":6,'
        b'"text":"Hello world","type":"response.output_text.done"}\n\n'
        b"event: response.content_part.done\n"
        b'data: {"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],'
        b'"text":"Hello world","type":"output_text","logprobs":null},"sequence_number":7,'
        b'"type":"response.content_part.done"}\n\n'
        b"event: response.output_item.done\n"
        b'data: {"item":' + final_message + b',"output_index":0,"sequence_number":8,'
        b'"type":"response.output_item.done"}\n\n'
        b"event: response.completed\n"
        b'data: {"response":{"id":"resp_1","created_at":1,"incomplete_details":null,'
        b'"instructions":null,"metadata":null,"model":"m","object":"response","output":['
        + final_message
        + b'],"parallel_tool_calls":true,'
        b'"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,'
        + MIDDLE
        + b'"status":"completed","text":null,"top_logprobs":null,"truncation":"disabled","usage":'
        + USAGE.replace(b'"output_tokens":2', b'"output_tokens":3').replace(b'"total_tokens":5', b'"total_tokens":6')
        + b',"user":null,'
        + TAIL
        + b',"sequence_number":9,"type":"response.completed"}\n\n'
    )
    assert renderer.final is not None and renderer.final["usage"]["output_tokens"] == 3  # type: ignore[index]


def test_an_eos_token_arriving_with_the_last_text_still_makes_no_event() -> None:
    """A late client gets the rest at once: the deltas, then the closing events, the
    sequence numbers unbroken."""
    run = EngineRun(**LATENCY)
    plan = eos_plan("a", "b", "c")
    renderer = ResponsesStreamRenderer(shell=SHELL, plan=plan, ids=IDS, logprobs=None)
    sink = run.streaming_sink(renderer, 1)
    run.submit([turn_job(sink, plan)])
    run.response.write(renderer.head())
    run.step_to(0.1)
    run.step_to(0.5)
    parsed = events(run.response.body)
    assert [p["sequence_number"] for _, p in parsed] == list(range(len(parsed)))
    assert [p["delta"] for kind, p in parsed if kind == "response.output_text.delta"] == ["a", "b", "c"]
    assert parsed[-1][1]["response"]["usage"]["output_tokens"] == 4  # type: ignore[index]


def test_a_stream_gives_the_eos_token_no_logprobs() -> None:
    """The stream's logprobs are its deltas', and its final part keeps those
    (streaming_events.py:893-919, serving.py:860-861): none for the EOS token."""
    run, _, _ = run_stream(eos_plan("Hello", "!"), TokenLogprobs(top_n=0, seed=9, eos="<|im_end|>"))
    parsed = events(run.response.body)
    part = parsed[-1][1]["response"]["output"][0]["content"][0]  # type: ignore[index]
    assert [entry["token"] for entry in part["logprobs"]] == ["Hello", "!"]
    assert [kind for kind, _ in parsed].count("response.output_text.delta") == 2


def test_a_tool_turn_ends_with_its_eos_token_too() -> None:
    """A function call is text the engine ends with its EOS like any other: counted, no
    delta for it, the closing events one ITL after the last argument piece."""
    pieces = ('{"', "city", '"}', "")
    plan = TurnPlan(pieces, (1, 2, 3, EOS_ID), "tool_calls", (Block(TOOL_CALL, 0, 3, "get_weather", "call_1"),))
    run, _, _ = run_stream(plan)
    writes = run.writes_at()
    assert writes[0.12].startswith(b"event: response.function_call_arguments.delta\n")
    assert writes[0.12].count(b"event: ") == 1
    closing = events(writes[0.13])
    assert [kind for kind, _ in closing] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [p["sequence_number"] for _, p in closing] == [6, 7, 8]
    assert closing[-1][1]["response"]["usage"]["output_tokens"] == 4  # type: ignore[index]


def test_a_token_whose_text_is_held_back_sends_no_delta_nor_logprobs() -> None:
    """Held back for a stop string, a token's text is empty: no delta (serving.py:1269-1274),
    so its logprobs go nowhere, in the stream or in its final part (streaming_events.py:
    893-919); the other deltas' logprobs name their whole tokens."""
    plan = TurnPlan(("a", "", "bcd"), (10, 11, 12), "length", (Block(TEXT, 0, 3),), whole_tokens=("ab", "c", "d"))
    run, _, _ = run_stream(plan, TokenLogprobs(top_n=0, seed=9, eos="<|im_end|>"))
    parsed = events(run.response.body)
    deltas = [p for kind, p in parsed if kind == "response.output_text.delta"]
    assert [(d["delta"], d["logprobs"][0]["token"]) for d in deltas] == [("a", "ab"), ("bcd", "d")]  # type: ignore[index]
    assert [p["sequence_number"] for _, p in parsed] == list(range(len(parsed)))
    part = parsed[-1][1]["response"]["output"][0]["content"][0]  # type: ignore[index]
    assert [entry["token"] for entry in part["logprobs"]] == ["ab", "d"]
    assert part["text"] == "abcd"
