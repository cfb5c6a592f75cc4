"""Golden bytes of Anthropic /v1/messages streams: renderer + sink driven by a real
Engine with explicit times (TTFT 100 ms, ITL 10 ms), no server."""

from __future__ import annotations

from llmsim.api.errors import ApiError
from llmsim.api.messages.render import (
    MessageShell,
    MessagesStreamRenderer,
    message_body,
)
from llmsim.api.turns import TEXT, TOOL_CALL, Block, TurnPlan
from llmsim.engine.job import Job
from tests.api.fakes import EngineRun, turn_job

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
SHELL = MessageShell("msg_1", "m")
START = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],'
    b'"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":0,'
    b'"cache_read_input_tokens":0,"output_tokens":1}}}\n\n'
)
PING = b'event: ping\ndata: {"type": "ping"}\n\n'
STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def run_stream(plan: TurnPlan, shell: MessageShell = SHELL) -> tuple[EngineRun, Job]:
    run = EngineRun(**LATENCY)
    renderer = MessagesStreamRenderer(shell=shell, plan=plan)
    sink = run.streaming_sink(renderer, 1)
    job = turn_job(sink, plan)
    run.submit([job])
    assert renderer.head() == b""
    run.run()
    assert sink.ended and run.response.ended
    return run, job


def block_start(index: int, block: bytes) -> bytes:
    return b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,"content_block":%s}\n\n' % (
        index,
        block,
    )


def delta(index: int, kind: bytes, key: bytes, text: bytes) -> bytes:
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
        b'"delta":{"type":"%s","%s":"%s"}}\n\n' % (index, kind, key, text)
    )


def block_stop(index: int) -> bytes:
    return b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n' % index


def message_delta(reason: bytes, output_tokens: int, sequence: bytes = b"null") -> bytes:
    return (
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":%s,"stop_sequence":%s},'
        b'"usage":{"output_tokens":%d}}\n\n' % (reason, sequence, output_tokens)
    )


def test_text_stream_exact_bytes() -> None:
    plan = TurnPlan(("Hello", ' "world"'), (1, 2), "stop", (Block(TEXT, 0, 2),))
    run, job = run_stream(plan)
    assert run.writes_at() == {
        0.1: START + block_start(0, b'{"type":"text","text":""}') + PING + delta(0, b"text_delta", b"text", b"Hello"),
        0.11: delta(0, b"text_delta", b"text", b' \\"world\\"')
        + block_stop(0)
        + message_delta(b'"end_turn"', 2)
        + STOP,
    }
    assert message_body(SHELL, plan, job) == (
        b'{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hello \\"world\\""}],'
        b'"model":"m","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,'
        b'"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2}}'
    )


def test_two_tool_use_blocks_exact_bytes() -> None:
    pieces = ('{"a": ', "1}", "{}")
    blocks = (Block(TOOL_CALL, 0, 2, "f", "toolu_1_0"), Block(TOOL_CALL, 2, 3, "g", "toolu_1_1"))
    plan = TurnPlan(pieces, (1, 2, 3), "tool_calls", blocks)
    run, job = run_stream(plan)
    json_delta = b"input_json_delta", b"partial_json"
    assert run.writes_at() == {
        0.1: START
        + block_start(0, b'{"type":"tool_use","id":"toolu_1_0","name":"f","input":{}}')
        + PING
        + delta(0, *json_delta, b"")
        + delta(0, *json_delta, b'{\\"a\\": '),
        0.11: delta(0, *json_delta, b"1}"),
        0.12: block_stop(0)
        + block_start(1, b'{"type":"tool_use","id":"toolu_1_1","name":"g","input":{}}')
        + delta(1, *json_delta, b"")
        + delta(1, *json_delta, b"{}")
        + block_stop(1)
        + message_delta(b'"tool_use"', 3)
        + STOP,
    }
    assert b'"content":[{"type":"tool_use","id":"toolu_1_0","name":"f","input":{"a":1}},' in message_body(
        SHELL, plan, job
    )


def test_max_tokens_and_stop_sequence_reasons() -> None:
    capped = TurnPlan(("a",), (1,), "length", (Block(TEXT, 0, 1),))
    run, _ = run_stream(capped)
    assert run.response.body.endswith(message_delta(b'"max_tokens"', 1) + STOP)
    stopped = TurnPlan(("a",), (1,), "stop", (Block(TEXT, 0, 1),))
    run, _ = run_stream(stopped, MessageShell("msg_1", "m", "\n\nHuman:"))
    assert run.response.body.endswith(message_delta(b'"stop_sequence"', 1, b'"\\n\\nHuman:"') + STOP)


def test_in_band_error_event() -> None:
    run = EngineRun(**LATENCY)
    plan = TurnPlan(("a", "b"), (1, 2), "stop", (Block(TEXT, 0, 2),))
    renderer = MessagesStreamRenderer(shell=SHELL, plan=plan)
    sink = run.streaming_sink(renderer, 1)
    run.submit([turn_job(sink, plan)])
    run.step_to(0.1)
    sink.fail(ApiError(529, "Overloaded"))
    assert run.response.writes[-1][1] == (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    )
    assert run.response.ended


def test_the_eos_token_sends_no_delta_and_the_message_closes_one_itl_later() -> None:
    """vLLM's /v1/messages is chat underneath: the EOS chunk's empty content makes no
    ``content_block_delta`` (anthropic/serving.py:1118-1120), the block stop and the
    message's closing events come with the stream's end, one ITL after the last text
    (serving.py:1056-1080), and ``output_tokens`` is chat's ``completion_tokens``, EOS
    included (serving.py:97-98)."""
    plan = TurnPlan(("Hello", "!", ""), (1, 2, 151645), "stop", (Block(TEXT, 0, 2),))
    run, job = run_stream(plan)
    assert run.writes_at() == {
        0.1: START + block_start(0, b'{"type":"text","text":""}') + PING + delta(0, b"text_delta", b"text", b"Hello"),
        0.11: delta(0, b"text_delta", b"text", b"!"),
        0.12: block_stop(0) + message_delta(b'"end_turn"', 3) + STOP,
    }
    assert message_body(SHELL, plan, job) == (
        b'{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hello!"}],'
        b'"model":"m","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,'
        b'"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3}}'
    )


def test_held_back_text_sends_no_delta() -> None:
    """A stop sequence's hold-back leaves some tokens without text: no delta for them
    (anthropic/serving.py:1118-1120); the text they held comes with a later token."""
    plan = TurnPlan(("ab", "", "cd"), (1, 2, 3), "length", (Block(TEXT, 0, 3),))
    run, _ = run_stream(plan)
    assert run.writes_at() == {
        0.1: START + block_start(0, b'{"type":"text","text":""}') + PING + delta(0, b"text_delta", b"text", b"ab"),
        0.12: delta(0, b"text_delta", b"text", b"cd") + block_stop(0) + message_delta(b'"max_tokens"', 3) + STOP,
    }
