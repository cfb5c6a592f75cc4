"""Golden bytes of /v1/completions streams and bodies: renderer + sink driven by a real
Engine with explicit times (TTFT 100 ms, ITL 10 ms), no server."""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.api.completions.render import CompletionStreamRenderer, completion_body
from llmsim.api.generation import CollectingSink
from llmsim.engine.job import Job
from tests.api.fakes import EngineRun, make_job

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HEAD = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
DONE = b"data: [DONE]\n\n"


def chunk(text: bytes, reason: bytes | None = None, index: int = 0) -> bytes:
    finish = b"null" if reason is None else b'"%s"' % reason
    return (
        HEAD + b'[{"index":%d,"text":"%s","logprobs":null,"finish_reason":%s,"stop_reason":null,'
        b'"prompt_token_ids":null,"token_ids":null}],"usage":null}\n\n' % (index, text, finish)
    )


def stream(
    outputs: Sequence[tuple[tuple[str, ...], str]],
    *,
    choices_per_prompt: int = 1,
    include_usage: bool = False,
    echo_prompts: Sequence[str] | None = None,
    prompt_tokens: int = 3,
) -> tuple[EngineRun, list[Job]]:
    run = EngineRun(**LATENCY)
    renderer = CompletionStreamRenderer(
        response_id="cmpl-1",
        created=1,
        model="m",
        choices=len(outputs),
        choices_per_prompt=choices_per_prompt,
        include_usage=include_usage,
        echo_prompts=echo_prompts,
    )
    sink = run.streaming_sink(renderer, len(outputs))
    jobs = [
        make_job(sink, pieces, reason, index=i, prompt_tokens=prompt_tokens)
        for i, (pieces, reason) in enumerate(outputs)
    ]
    run.submit(jobs)
    run.run()
    assert sink.done.is_set() and run.response.ended
    return run, jobs


def test_one_choice_with_usage_exact_bytes() -> None:
    run, _ = stream([((" performance", " and"), "length")], include_usage=True)
    assert run.writes_at() == {
        0.1: (
            b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
            b'"text":" performance","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
            b'"token_ids":null}],"usage":null}\n\n'
        ),
        0.11: (
            b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
            b'"text":" and","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,'
            b'"token_ids":null}],"usage":null}\n\n'
            b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":'
            b'{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
            b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
            b"data: [DONE]\n\n"
        ),
    }


def test_finish_reason_rides_on_the_last_token_without_usage() -> None:
    run, _ = stream([(("a", "b", "c"), "stop")])
    assert run.response.body == chunk(b"a") + chunk(b"b") + chunk(b"c", b"stop") + DONE


def test_a_job_without_tokens_sends_one_empty_finishing_chunk() -> None:
    run, _ = stream([((), "stop")])
    assert run.response.body == chunk(b"", b"stop") + DONE


def test_echo_prepends_each_prompt_to_its_choices_first_chunk() -> None:
    run, _ = stream(
        [(("x", "y"), "length"), (("z",), "stop"), ((), "stop")],
        echo_prompts=['Say "hi"', "1 2"],
        choices_per_prompt=2,
    )
    assert run.writes_at() == {
        0.1: chunk(b'Say \\"hi\\"x', index=0)
        + chunk(b'Say \\"hi\\"z', b"stop", index=1)
        + chunk(b"1 2", b"stop", index=2),
        0.11: chunk(b"y", b"length", index=0) + DONE,
    }


def test_usage_counts_each_prompt_once_and_every_choice() -> None:
    outputs = [(("a",), "length"), (("b", "c"), "length"), (("d",), "length"), ((), "stop")]
    run, _ = stream(outputs, choices_per_prompt=2, include_usage=True, prompt_tokens=4)
    usage = (
        HEAD + b'[],"usage":{"prompt_tokens":8,"total_tokens":12,"completion_tokens":4,'
        b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    )
    assert run.response.body.endswith(usage + DONE)
    indexes = [int(part.split(b",", 1)[0]) for part in run.response.body.split(b'"choices":[{"index":')[1:]]
    assert sorted(set(indexes)) == [0, 1, 2, 3]


def test_non_streaming_body_exact_bytes() -> None:
    run = EngineRun(**LATENCY)
    sink = CollectingSink(2)
    jobs = [make_job(sink, (" Paris", ","), "length", index=0), make_job(sink, ("!",), "stop", index=1)]
    run.submit(jobs)
    run.run()
    assert sink.done.is_set()
    body = completion_body(
        response_id="cmpl-1", created=1, model="m", jobs=jobs[::-1], choices_per_prompt=1, echo_prompts=["A", "B"]
    )
    assert body == (
        b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":['
        b'{"index":0,"text":"A Paris,","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,'
        b'"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null},'
        b'{"index":1,"text":"B!","logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,'
        b'"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],'
        b'"service_tier":null,"system_fingerprint":null,'
        b'"usage":{"prompt_tokens":6,"total_tokens":9,"completion_tokens":3,'
        b'"prompt_tokens_details":{"cached_tokens":0}},'
        b'"kv_transfer_params":null}'
    )
