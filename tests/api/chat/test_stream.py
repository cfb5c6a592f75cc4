"""Golden bytes of /v1/chat/completions streams: renderer + sink driven by a real
Engine with explicit times (TTFT 100 ms, ITL 10 ms), no server."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest

from llmsim.api.chat.render import ChatStreamRenderer, chat_completion_body
from llmsim.api.errors import ApiError
from llmsim.api.generation import CollectingSink
from llmsim.engine.job import Job
from tests.api.fakes import EngineRun, make_job

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
DONE = b"data: [DONE]\n\n"


def role(index: int = 0) -> bytes:
    return (
        HEAD + b'[{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
        b'"prompt_token_ids":null,"prompt_text":null}\n\n' % index
    )


def token(text: bytes, index: int = 0) -> bytes:
    return (
        HEAD
        + b'[{"index":%d,"delta":{"content":"%s"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
        % (index, text)
    )


def finish(reason: bytes, index: int = 0) -> bytes:
    return (
        HEAD + b'[{"index":%d,"delta":{"content":""},"logprobs":null,"finish_reason":"%s","stop_reason":null,'
        b'"token_ids":null}]}\n\n' % (index, reason)
    )


def stream(
    outputs: Sequence[tuple[tuple[str, ...], str]], *, include_usage: bool = False, echo: str | None = None
) -> tuple[EngineRun, list[Job]]:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1", created=1, model="m", choices=len(outputs), include_usage=include_usage, echo=echo
    )
    sink = run.streaming_sink(renderer, len(outputs))
    jobs = [make_job(sink, pieces, reason, index=i) for i, (pieces, reason) in enumerate(outputs)]
    run.submit(jobs)
    run.run()
    assert sink.done.is_set()
    return run, jobs


def test_one_choice_with_usage_exact_bytes() -> None:
    run, _ = stream([(("Hello", " world"), "length")], include_usage=True)
    assert run.writes_at() == {
        0.1: (
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,'
            b'"prompt_text":null}\n\n'
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
        ),
        0.11: (
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"content":" world"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null,'
            b'"token_ids":null}]}\n\n'
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":'
            b'{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
            b"data: [DONE]\n\n"
        ),
    }
    assert run.response.ended


def test_without_usage_ends_with_finish_and_done() -> None:
    run, _ = stream([(("a", "b", "c"), "stop")])
    assert run.response.body == role() + token(b"a") + token(b"b") + token(b"c") + finish(b"stop") + DONE


def test_nothing_is_written_before_the_first_token() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, ("x",))])
    run.step_to(0.0999)
    assert run.response.writes == []
    run.step_to(0.1)
    assert run.response.body == role() + token(b"x") + finish(b"stop") + DONE


def test_two_choices_one_choice_per_chunk_role_once_per_index() -> None:
    run, _ = stream([(("a", "b"), "length"), (("c",), "stop")], include_usage=True)
    usage = (
        HEAD + b'[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3,'
        b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    )
    assert run.writes_at() == {
        0.1: role(0) + token(b"a", 0) + role(1) + token(b"c", 1) + finish(b"stop", 1),
        0.11: token(b"b", 0) + finish(b"length", 0) + usage + DONE,
    }


def test_echo_of_the_assistant_prefix_follows_the_role_chunk() -> None:
    run, _ = stream([(("there",), "stop")], echo="Hi ")
    echo = HEAD + b'[{"index":0,"delta":{"content":"Hi "},"logprobs":null,"finish_reason":null}]}\n\n'
    assert run.response.body == role() + echo + token(b"there") + finish(b"stop") + DONE


def test_pieces_are_json_escaped() -> None:
    run, _ = stream([(('say "hi"\n', "caf\u00e9\\", "\x01"), "stop")])
    assert run.response.body == (
        role()
        + token(b'say \\"hi\\"\\n')
        + token("caf\u00e9\\\\".encode())
        + token(b"\\u0001")
        + finish(b"stop")
        + DONE
    )


def test_a_job_without_tokens_sends_role_and_finish() -> None:
    run, _ = stream([((), "stop")])
    assert run.response.body == role() + finish(b"stop") + DONE


def test_tokens_due_in_one_step_leave_in_one_write() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, ("a", "b", "c", "d"))])
    run.step_to(0.125)  # late: first token and the two after it are due
    assert [data for _, data in run.response.writes] == [role() + token(b"a") + token(b"b") + token(b"c")]


def test_backpressure_pauses_and_resumes_without_losing_tokens() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
    sink = run.streaming_sink(renderer, 1)
    job = make_job(sink, ("a", "b", "c"))
    run.submit([job])
    run.response.full = True
    run.step_to(0.1)
    assert job.paused
    run.step_to(0.5)
    assert job.emitted == 1  # paused: no token while the buffer is full
    run.response.drain()
    assert not job.paused
    run.run()
    assert run.response.body == role() + token(b"a") + token(b"b") + token(b"c") + finish(b"stop") + DONE


class _BrokenRenderer(ChatStreamRenderer):
    def render(self, job: Job, start: int, stop: int) -> bytes:
        if start > 0:
            raise RuntimeError("renderer bug")
        return super().render(job, start, stop)


def test_a_failure_after_the_stream_began_is_reported_in_band() -> None:
    run = EngineRun(**LATENCY)
    renderer = _BrokenRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
    sink = run.streaming_sink(renderer, 1)
    job = make_job(sink, ("a", "b", "c"))
    run.submit([job])
    run.run()  # the engine task survives the broken renderer
    assert sink.done.is_set()
    assert run.response.ended
    assert run.response.body == (
        role()
        + token(b"a")
        + b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, '
        b'"code": 500}}\n\n' + DONE
    )


def test_fail_sends_the_error_event_and_done() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
    sink = run.streaming_sink(renderer, 1)
    sink.fail(ApiError(503, "engine gone", error_type="ServiceUnavailable"))
    assert run.response.body == (
        b'data: {"error": {"message": "engine gone", "type": "ServiceUnavailable", "param": null, "code": 503}}\n\n'
        + DONE
    )


@pytest.mark.parametrize("echo", [None, "Once upon "])
def test_non_streaming_body_exact_bytes(echo: str | None) -> None:
    run = EngineRun(**LATENCY)
    sink = CollectingSink(2)
    jobs = [make_job(sink, ("a", " time"), "length", index=0), make_job(sink, (), "stop", index=1)]
    run.submit(jobs)
    run.run()
    assert sink.done.is_set()
    body = chat_completion_body(response_id="chatcmpl-1", created=1, model="m", jobs=jobs[::-1], echo=echo)
    prefix = (echo or "").encode()
    assert body == (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":['
        b'{"index":0,"message":{"role":"assistant","content":"' + prefix + b'a time","refusal":null,"annotations":null,'
        b'"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length",'
        b'"stop_reason":null,"token_ids":null,"routed_experts":null},'
        b'{"index":1,"message":{"role":"assistant","content":"' + prefix + b'","refusal":null,"annotations":null,'
        b'"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"stop",'
        b'"stop_reason":null,"token_ids":null,"routed_experts":null}],'
        b'"service_tier":null,"system_fingerprint":null,'
        b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
        b'"prompt_tokens_details":{"cached_tokens":0}},'
        b'"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,'
        b'"ec_transfer_params":null,"metrics":null}'
    )
    assert orjson.loads(body)["usage"]["total_tokens"] == 5
