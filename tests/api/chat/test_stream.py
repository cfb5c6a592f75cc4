"""Golden bytes of /v1/chat/completions streams: renderer + sink driven by a real
Engine with explicit times (TTFT 100 ms, ITL 10 ms), no server."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest

from llmsim.api.chat.render import CHAT_USAGE, ChatStreamRenderer, chat_completion_body
from llmsim.api.errors import ApiError
from llmsim.api.generation import CollectingSink
from llmsim.api.usage import ChunkUsage, UsageStyle
from llmsim.engine.job import Job
from tests.api.fakes import EngineRun, make_job

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
DONE = b"data: [DONE]\n\n"


def role(index: int = 0, usage: bytes = b"") -> bytes:
    return (
        HEAD + b'[{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]%s,'
        b'"prompt_token_ids":null,"prompt_text":null}\n\n' % (index, usage)
    )


def token(text: bytes, index: int = 0, *, finish: bytes | None = None, usage: bytes = b"") -> bytes:
    """A token's chunk; the last one of its choice (``finish``) carries vLLM's finish keys
    (vllm/entrypoints/openai/chat_completion/serving.py:796-809)."""
    reason = (
        b'null,"token_ids":null'
        if finish is None
        else b'"%s","stop_reason":null,"token_ids":null,"weight_versions":null' % finish
    )
    # kv_transfer_params: passed on every token chunk (serving.py:815-823), so kept by exclude_unset
    return (
        HEAD
        + b'[{"index":%d,"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s}]%s,"kv_transfer_params":null}\n\n'
        % (
            index,
            text,
            reason,
            usage,
        )
    )


def eos(reason: bytes = b"stop", index: int = 0, usage: bytes = b"") -> bytes:
    """The EOS token's chunk: empty content, the finish reason."""
    return token(b"", index, finish=reason, usage=usage)


def usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    """The cumulative usage of one chunk (serving.py:624-634, 838-851)."""
    return (
        b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"completion_tokens_details":null}'
        % (prompt_tokens, prompt_tokens + completion_tokens, completion_tokens)
    )


def stream(
    outputs: Sequence[tuple[tuple[str, ...], str]],
    *,
    include_usage: bool = False,
    echo: str | None = None,
    chunk_usage: ChunkUsage | None = None,
    fingerprint: str | None = None,
    usage_style: UsageStyle = CHAT_USAGE,
) -> tuple[EngineRun, list[Job]]:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1",
        created=1,
        model="m",
        choices=len(outputs),
        include_usage=include_usage,
        echo=echo,
        chunk_usage=chunk_usage,
        fingerprint=fingerprint,
        usage_style=usage_style,
    )
    sink = run.streaming_sink(renderer, len(outputs))
    jobs = [make_job(sink, pieces, reason, index=i) for i, (pieces, reason) in enumerate(outputs)]
    run.submit(jobs)
    run.run()
    assert sink.ended
    return run, jobs


def test_length_finish_rides_on_the_last_token_exact_bytes() -> None:
    """N tokens, N content chunks: no extra empty chunk in the last token's write
    (serving.py:796-809 puts the final output's delta and finish_reason in one chunk)."""
    run, _ = stream([(("Hello", " world"), "length")], include_usage=True)
    assert run.writes_at() == {
        0.1: (
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,'
            b'"prompt_text":null}\n\n'
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}],'
            b'"kv_transfer_params":null}\n\n'
        ),
        0.11: (
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
            b'"delta":{"content":" world"},"logprobs":null,"finish_reason":"length","stop_reason":null,'
            b'"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":'
            b'{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}\n\n'
            b"data: [DONE]\n\n"
        ),
    }
    assert run.response.ended


def test_the_eos_token_sends_its_empty_stop_chunk_one_itl_later_and_counts() -> None:
    """A natural stop is the EOS token: its own chunk, empty content, ``stop``, one decode
    step after the last text (vllm/v1/engine/detokenizer.py:107-128 drops its text, keeps
    its id; serving.py:1099-1101 counts it)."""
    run, _ = stream([(("a", "b", ""), "stop")], include_usage=True)
    assert run.writes_at() == {
        0.1: role() + token(b"a"),
        0.11: token(b"b"),
        0.12: eos() + HEAD + b'[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}\n\n' + DONE,
    }


def test_nothing_is_written_before_the_first_token() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, ("x", ""))])
    run.step_to(0.0999)
    assert run.response.writes == []
    run.step_to(0.1)
    assert run.response.body == role() + token(b"x")
    run.step_to(0.11)
    assert run.response.body == role() + token(b"x") + eos() + DONE


def test_two_choices_role_chunks_for_every_choice_first() -> None:
    """The first engine output sends the role chunk of every choice before any token
    (``for i in range(num_choices)``, serving.py:597-634)."""
    run, _ = stream([(("a", "b"), "length"), (("c", ""), "stop")], include_usage=True)
    usage_chunk = HEAD + b'[],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}}\n\n'
    assert run.writes_at() == {
        0.1: role(0) + role(1) + token(b"a", 0) + token(b"c", 1),
        0.11: token(b"b", 0, finish=b"length") + eos(index=1) + usage_chunk + DONE,
    }


def test_a_choice_admitted_later_gets_no_second_role_chunk() -> None:
    run = EngineRun(**LATENCY, max_num_seqs=1)
    renderer = ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=2, include_usage=False)
    sink = run.streaming_sink(renderer, 2)
    run.submit([make_job(sink, ("a",), "length", index=0), make_job(sink, ("b",), "length", index=1)])
    run.run()
    assert run.response.body == (
        role(0) + role(1) + token(b"a", 0, finish=b"length") + token(b"b", 1, finish=b"length") + DONE
    )


def test_echo_of_the_assistant_prefix_follows_the_role_chunks_of_every_choice() -> None:
    """serving.py:636-672: roles for every choice, then the echo for every choice."""
    run, _ = stream([(("there", ""), "stop"), (("you",), "length")], echo="Hi ")

    def echo(index: int) -> bytes:
        return HEAD + b'[{"index":%d,"delta":{"content":"Hi "},"logprobs":null,"finish_reason":null}]}\n\n' % index

    assert run.response.body == (
        role(0)
        + role(1)
        + echo(0)
        + echo(1)
        + token(b"there", 0)
        + token(b"you", 1, finish=b"length")
        + eos(index=0)
        + DONE
    )


def test_continuous_usage_stats_put_cumulative_usage_on_every_chunk_exact_bytes() -> None:
    """``continuous_usage_stats``: the role chunk counts 0 tokens, each token chunk its
    choice's tokens so far, the EOS one included; the final usage chunk stays
    (serving.py:624-634, 838-851; ``exclude_unset`` keeps the explicit
    ``completion_tokens_details``)."""
    run, _ = stream([(("a", ""), "stop")], include_usage=True, chunk_usage=ChunkUsage(3, with_details=True))
    assert run.response.body == (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":3,'
        b'"total_tokens":3,"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,'
        b'"prompt_text":null}\n\n'
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":3,'
        b'"total_tokens":4,"completion_tokens":1,"completion_tokens_details":null},"kv_transfer_params":null}\n\n'
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,'
        b'"weight_versions":null}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
        b'"completion_tokens_details":null},"kv_transfer_params":null}\n\n'
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":'
        b'{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}\n\n'
        b"data: [DONE]\n\n"
    )


def test_continuous_usage_counts_each_choice_on_its_own() -> None:
    """Per choice, not per request: ``processor.num_output_tokens`` (serving.py:838-851)."""
    run, _ = stream(
        [(("a", "b"), "length"), (("c",), "length")], echo="Hi ", chunk_usage=ChunkUsage(3, with_details=True)
    )
    echo = HEAD + b'[{"index":%d,"delta":{"content":"Hi "},"logprobs":null,"finish_reason":null}]%s}\n\n'
    assert run.response.body == (
        role(0, usage(3, 0))
        + role(1, usage(3, 0))
        + echo % (0, usage(3, 0))
        + echo % (1, usage(3, 0))
        + token(b"a", 0, usage=usage(3, 1))
        + token(b"c", 1, finish=b"length", usage=usage(3, 1))
        + token(b"b", 0, finish=b"length", usage=usage(3, 2))
        + DONE
    )


def test_pieces_are_json_escaped() -> None:
    run, _ = stream([(('say "hi"\n', "caf\u00e9\\", "\x01", ""), "stop")])
    assert run.response.body == (
        role() + token(b'say \\"hi\\"\\n') + token("caf\u00e9\\\\".encode()) + token(b"\\u0001") + eos() + DONE
    )


def test_a_job_without_tokens_sends_role_and_finish() -> None:
    run, _ = stream([((), "length")])
    assert run.response.body == role() + eos(b"length") + DONE


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
    assert run.response.body == role() + token(b"a") + token(b"b") + token(b"c", finish=b"stop") + DONE


class _BrokenRenderer(ChatStreamRenderer):
    def plain_tokens(self) -> None:
        return None  # every token through render(), which fails

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
    assert sink.ended
    assert run.response.ended
    # chat yields the ErrorResponse, dumped compact like its chunks
    # (vllm/entrypoints/openai/chat_completion/serving.py:496-497,951-953)
    assert run.response.body == (
        role()
        + token(b"a")
        + b'data: {"error":{"message":"Internal server error","type":"InternalServerError","param":null,'
        b'"code":500}}\n\n' + DONE
    )


def test_fail_sends_the_error_event_and_done() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
    sink = run.streaming_sink(renderer, 1)
    sink.fail(ApiError(503, "engine gone", error_type="ServiceUnavailable"))
    assert run.response.body == (
        b'data: {"error":{"message":"engine gone","type":"ServiceUnavailable","param":null,"code":503}}\n\n' + DONE
    )


@pytest.mark.parametrize("echo", [None, "Once upon "])
def test_non_streaming_body_exact_bytes(echo: str | None) -> None:
    run = EngineRun(**LATENCY)
    sink = CollectingSink(2)
    jobs = [make_job(sink, ("a", " time"), "length", index=0), make_job(sink, (), "stop", index=1)]
    run.submit(jobs)
    run.run()
    assert sink.done.is_set()
    body = chat_completion_body(
        response_id="chatcmpl-1", created=1, model="m", jobs=jobs[::-1], echo=echo, fingerprint="vllm-0.33.0-0123abcd"
    )
    # ChatCompletionResponse dumped whole (vllm/entrypoints/openai/chat_completion/protocol.py:113-164,
    # api_router.py:113): weight_versions on each choice, UsageInfo's null details
    prefix = (echo or "").encode()
    assert body == (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":['
        b'{"index":0,"message":{"role":"assistant","content":"' + prefix + b'a time","refusal":null,"annotations":null,'
        b'"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length",'
        b'"stop_reason":null,"token_ids":null,"routed_experts":null,"weight_versions":null},'
        b'{"index":1,"message":{"role":"assistant","content":"' + prefix + b'","refusal":null,"annotations":null,'
        b'"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"stop",'
        b'"stop_reason":null,"token_ids":null,"routed_experts":null,"weight_versions":null}],'
        b'"service_tier":null,"system_fingerprint":"vllm-0.33.0-0123abcd",'
        b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
        b'"prompt_tokens_details":null,"completion_tokens_details":null},'
        b'"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,'
        b'"ec_transfer_params":null,"metrics":null}'
    )
    assert orjson.loads(body)["usage"]["total_tokens"] == 5


FINGERPRINT = b',"system_fingerprint":"vllm-0.33.0-0123abcd"'


def fingerprinted_stream(outputs: Sequence[tuple[tuple[str, ...], str]], *, include_usage: bool) -> bytes:
    style = UsageStyle(prompt_details=True, created_cache_tokens=True)
    run, _ = stream(outputs, include_usage=include_usage, fingerprint="vllm-0.33.0-0123abcd", usage_style=style)
    return run.response.body


def test_the_fingerprint_rides_on_each_finishing_chunk_without_a_usage_chunk() -> None:
    """``system_fingerprint`` only on a chunk with a finish_reason, and only when no
    usage chunk follows (vllm/entrypoints/openai/chat_completion/serving.py:824-834),
    between ``choices`` and ``kv_transfer_params`` (protocol.py:186-203)."""
    finish = b'"stop_reason":null,"token_ids":null,"weight_versions":null}]'
    assert fingerprinted_stream([(("a", ""), "stop"), (("b",), "length")], include_usage=False) == (
        role(0)
        + role(1)
        + token(b"a", 0)
        + HEAD
        + b'[{"index":1,"delta":{"content":"b"},"logprobs":null,"finish_reason":"length",'
        + finish
        + FINGERPRINT
        + b',"kv_transfer_params":null}\n\n'
        + HEAD
        + b'[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop",'
        + finish
        + FINGERPRINT
        + b',"kv_transfer_params":null}\n\n'
        + DONE
    )


def test_with_a_usage_chunk_the_fingerprint_and_prompt_details_go_on_it() -> None:
    """With ``include_usage`` the usage chunk alone carries the fingerprint
    (serving.py:903-912), dumped with exclude_none (serving.py:499-501): with
    --enable-prompt-tokens-details, ``{"cached_tokens", "created_cache_tokens"}``
    (serving.py:95-114), the prompt's full 16-token blocks written to the cache
    (vllm/v1/metrics/stats.py:342-346)."""
    body = fingerprinted_stream([(("a", ""), "stop")], include_usage=True)
    assert body == (
        role()
        + token(b"a")
        + eos()
        + HEAD
        + b'[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
        + b'"prompt_tokens_details":{"cached_tokens":0,"created_cache_tokens":0}}'
        + FINGERPRINT
        + b"}\n\n"
        + DONE
    )


def test_prompt_tokens_details_in_the_body_with_the_flag() -> None:
    """The body dumps ``PromptTokenUsageInfo`` whole (vllm/entrypoints/serve/engine/
    protocol.py:121-128): a 35-token prompt writes its two full blocks, 32 tokens."""
    run = EngineRun(**LATENCY)
    sink = CollectingSink(1)
    job = make_job(sink, ("a",), "length", prompt_tokens=35)
    run.submit([job])
    run.run()
    body = chat_completion_body(
        response_id="chatcmpl-1",
        created=1,
        model="m",
        jobs=[job],
        usage_style=UsageStyle(prompt_details=True, created_cache_tokens=True),
    )
    assert orjson.loads(body)["usage"] == {
        "prompt_tokens": 35,
        "total_tokens": 36,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": 32, "multimodal_tokens": None},
        "completion_tokens_details": None,
    }


PIECES = ("He", 'said "hi"', "\n", "\\", "\u00e9t\u00e9", "\U0001f600", "\x1f", "</s>", "")


class _RenderEveryToken(ChatStreamRenderer):
    def plain_tokens(self) -> None:
        return None


@pytest.mark.parametrize("choices", [1, 3])
def test_the_sinks_token_path_writes_what_render_returns(choices: int) -> None:
    """StreamingSink builds a middle token's chunk itself (PlainTokens): the stream must
    be byte for byte the one render() makes for every token, escapes and choices included."""
    bodies = []
    for renderer_class in (ChatStreamRenderer, _RenderEveryToken):
        renderer = renderer_class(response_id="chatcmpl-1", created=1, model="m", choices=choices, include_usage=True)
        run = EngineRun(**LATENCY)
        sink = run.streaming_sink(renderer, choices)
        run.submit([make_job(sink, PIECES, index=index) for index in range(choices)])
        run.run()
        bodies.append(run.response.body)
    assert (
        ChatStreamRenderer(response_id="c", created=1, model="m", choices=1, include_usage=False).plain_tokens()
        is not None
    )
    assert bodies[0] == bodies[1]
    assert bodies[0].count(b'"delta":{"content":') >= choices * (len(PIECES) - 2)


def test_the_plain_finish_tails_made_once_are_the_ones_dumped() -> None:
    """A finishing chunk's tail without a stop reason is looked up per finish reason
    (``_PLAIN_FINISH_TAILS``): the same bytes as dumping both values."""
    from llmsim.api.chat import render

    assert set(render._PLAIN_FINISH_TAILS) >= {"stop", "length", "tool_calls", "abort", "cache_threshold"}
    for reason, tail in render._PLAIN_FINISH_TAILS.items():
        assert tail == b',"finish_reason":' + orjson.dumps(reason) + b',"stop_reason":null' + render._FINISH_CLOSE
