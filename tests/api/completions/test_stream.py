"""Golden bytes of /v1/completions streams and bodies: renderer + sink driven by a real
Engine with explicit times (TTFT 100 ms, ITL 10 ms), no server."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from llmsim.api.completions.render import COMPLETION_USAGE, CompletionStreamRenderer, completion_body
from llmsim.api.generation import CollectingSink
from llmsim.api.usage import ChunkUsage, UsageStyle
from llmsim.engine.job import Job
from tests.api.fakes import EngineRun, make_job

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HEAD = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
DONE = b"data: [DONE]\n\n"


def chunk(text: bytes, reason: bytes | None = None, index: int = 0, usage: bytes | None = None) -> bytes:
    """A chunk as vLLM dumps it with ``exclude_unset`` (vllm/entrypoints/openai/completion/
    serving.py:437-486): every choice field passed, ``weight_versions`` too; no ``usage``
    key unless set; ``kv_transfer_params`` always."""
    finish = b"null" if reason is None else b'"%s"' % reason
    usage_key = b"" if usage is None else b',"usage":' + usage
    return (
        HEAD + b'[{"index":%d,"text":"%s","logprobs":null,"finish_reason":%s,"stop_reason":null,'
        b'"prompt_token_ids":null,"token_ids":null,"weight_versions":null}]%s,"kv_transfer_params":null}\n\n'
        % (index, text, finish, usage_key)
    )


def usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    """One chunk's cumulative usage: no ``completion_tokens_details`` key, which
    completions never sets (vllm/entrypoints/openai/completion/serving.py:477-484)."""
    return b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
        prompt_tokens,
        prompt_tokens + completion_tokens,
        completion_tokens,
    )


def stream(
    outputs: Sequence[tuple[tuple[str, ...], str]],
    *,
    choices_per_prompt: int = 1,
    include_usage: bool = False,
    echo_prompts: Sequence[str] | None = None,
    prompt_only: bool = False,
    prompt_tokens: int = 3,
    chunk_usages: Sequence[ChunkUsage] | None = None,
    fingerprint: str | None = None,
    usage_style: UsageStyle = COMPLETION_USAGE,
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
        prompt_only=prompt_only,
        chunk_usages=chunk_usages,
        fingerprint=fingerprint,
        usage_style=usage_style,
    )
    sink = run.streaming_sink(renderer, len(outputs))
    jobs = [
        make_job(sink, pieces, reason, index=i, prompt_tokens=prompt_tokens)
        for i, (pieces, reason) in enumerate(outputs)
    ]
    run.submit(jobs)
    run.run()
    assert sink.ended and run.response.ended
    return run, jobs


def test_one_choice_with_usage_exact_bytes() -> None:
    run, _ = stream([((" performance", " and"), "length")], include_usage=True)
    assert run.writes_at() == {
        0.1: (
            b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
            b'"text":" performance","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
            b'"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
        ),
        0.11: (
            b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
            b'"text":" and","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,'
            b'"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
            b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":'
            b'{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}\n\n'
            b"data: [DONE]\n\n"
        ),
    }


def test_a_natural_stop_is_the_eos_tokens_own_empty_chunk_one_itl_later() -> None:
    """The EOS token's chunk: ``text: ""``, ``stop``, one decode step after the last text,
    which no longer says ``stop`` (vllm/v1/engine/detokenizer.py:107-128 skips its text;
    completion/serving.py:438-470 sends each output as it comes), counted in usage."""
    run, _ = stream([(("a", "b", ""), "stop")], include_usage=True)
    assert run.writes_at() == {
        0.1: chunk(b"a"),
        0.11: chunk(b"b"),
        0.12: chunk(b"", b"stop")
        + HEAD
        + b'[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}\n\n'
        + DONE,
    }


def test_continuous_usage_stats_exact_bytes() -> None:
    """Every chunk's ``usage`` is its choice's tokens so far against its own prompt
    (completion/serving.py:477-484), the echoed prompt's chunk counting its one token."""
    run, _ = stream(
        [(("x", ""), "stop"), (("y",), "length")],
        echo_prompts=["Hi", "Bye now"],
        chunk_usages=[ChunkUsage(1, with_details=False), ChunkUsage(2, with_details=False)],
    )
    assert run.response.body == (
        chunk(b"Hix", index=0, usage=usage(1, 1))
        + chunk(b"Bye nowy", b"length", index=1, usage=usage(2, 1))
        + chunk(b"", b"stop", index=0, usage=usage(1, 2))
        + DONE
    )


def test_echo_without_generation_sends_the_prompt_alone_after_its_one_token() -> None:
    """``echo`` with ``max_tokens: 0``: one token generated (internal max_tokens 1), the
    prompt its only text (completion/protocol.py:393,416; serving.py:363-366); usage
    counts the token (serving.py:424)."""
    run, _ = stream(
        [(("unseen",), "length")],
        echo_prompts=["Say hi"],
        prompt_only=True,
        include_usage=True,
        chunk_usages=[ChunkUsage(3, with_details=False)],
    )
    assert run.writes_at() == {
        0.1: chunk(b"Say hi", b"length", usage=usage(3, 1))
        + HEAD
        + b'[],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}\n\n'
        + DONE
    }


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
    usage = HEAD + b'[],"usage":{"prompt_tokens":8,"total_tokens":12,"completion_tokens":4}}\n\n'
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
        response_id="cmpl-1",
        created=1,
        model="m",
        jobs=jobs[::-1],
        choices_per_prompt=1,
        echo_prompts=["A", "B"],
        fingerprint="vllm-0.33.0-0123abcd",
    )
    # CompletionResponse dumped whole (vllm/entrypoints/openai/completion/protocol.py:674-725,
    # serving.py:704-714): weight_versions, UsageInfo's null details, ec_transfer_params, metrics
    assert body == (
        b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":['
        b'{"index":0,"text":"A Paris,","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,'
        b'"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null,"weight_versions":null},'
        b'{"index":1,"text":"B!","logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,'
        b'"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null,"weight_versions":null}],'
        b'"service_tier":null,"system_fingerprint":"vllm-0.33.0-0123abcd",'
        b'"usage":{"prompt_tokens":6,"total_tokens":9,"completion_tokens":3,'
        b'"prompt_tokens_details":null,"completion_tokens_details":null},'
        b'"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
    )


def test_non_streaming_text_leaves_out_the_eos_token_and_usage_counts_it() -> None:
    """``output.text`` has no EOS text, ``len(output.token_ids)`` counts it
    (completion/serving.py:611-653)."""
    run = EngineRun(**LATENCY)
    sink = CollectingSink(1)
    jobs = [make_job(sink, (" Paris", "!", ""), "stop")]
    run.submit(jobs)
    run.run()
    body = orjson.loads(completion_body(response_id="cmpl-1", created=1, model="m", jobs=jobs, choices_per_prompt=1))
    assert (body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == (" Paris!", "stop")
    assert body["usage"]["completion_tokens"] == 3


def test_non_streaming_echo_without_generation_is_the_prompt_alone() -> None:
    """serving.py:594-597: the text is the prompt, usage still counts the token made."""
    run = EngineRun(**LATENCY)
    sink = CollectingSink(1)
    jobs = [make_job(sink, ("unseen",), "length")]
    run.submit(jobs)
    run.run()
    body = orjson.loads(
        completion_body(
            response_id="cmpl-1",
            created=1,
            model="m",
            jobs=jobs,
            choices_per_prompt=1,
            echo_prompts=["Say hi"],
            prompt_only=True,
        )
    )
    assert (body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == ("Say hi", "length")
    assert body["usage"]["completion_tokens"] == 1


FINGERPRINT = b',"system_fingerprint":"vllm-0.33.0-0123abcd"'


def fingerprinted_stream(outputs: Sequence[tuple[tuple[str, ...], str]], *, include_usage: bool) -> bytes:
    style = UsageStyle(prompt_details=True, created_cache_tokens=False)
    run, _ = stream(outputs, include_usage=include_usage, fingerprint="vllm-0.33.0-0123abcd", usage_style=style)
    return run.response.body


def test_the_fingerprint_rides_on_each_finishing_chunk_without_a_usage_chunk() -> None:
    """``system_fingerprint`` on a chunk with a finish_reason only, when no usage chunk
    follows (vllm/entrypoints/openai/completion/serving.py:467-476), before
    ``kv_transfer_params`` (protocol.py:748-764)."""
    finish = b'"stop_reason":null,"prompt_token_ids":null,"token_ids":null,"weight_versions":null}]'
    assert fingerprinted_stream([(("a", ""), "stop")], include_usage=False) == (
        chunk(b"a")
        + HEAD
        + b'[{"index":0,"text":"","logprobs":null,"finish_reason":"stop",'
        + finish
        + FINGERPRINT
        + b',"kv_transfer_params":null}\n\n'
        + DONE
    )


def test_with_a_usage_chunk_the_fingerprint_and_cached_tokens_go_on_it() -> None:
    """With ``include_usage`` the usage chunk alone carries the fingerprint, dumped with
    exclude_none (serving.py:535-546); --enable-prompt-tokens-details adds
    ``{"cached_tokens": N}`` alone (serving.py:508-511)."""
    assert fingerprinted_stream([(("a", ""), "stop")], include_usage=True) == (
        chunk(b"a")
        + chunk(b"", b"stop")
        + HEAD
        + b'[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
        + b'"prompt_tokens_details":{"cached_tokens":0}}'
        + FINGERPRINT
        + b"}\n\n"
        + DONE
    )


def test_prompt_tokens_details_in_the_body_with_the_flag() -> None:
    """``PromptTokenUsageInfo(cached_tokens=N)`` dumped whole (serving.py:668-675;
    vllm/entrypoints/serve/engine/protocol.py:121-128): no cache-write count."""
    run = EngineRun(**LATENCY)
    sink = CollectingSink(1)
    job = make_job(sink, ("a",), "length", prompt_tokens=35)
    run.submit([job])
    run.run()
    style = UsageStyle(prompt_details=True, created_cache_tokens=False)
    body = completion_body(
        response_id="cmpl-1", created=1, model="m", jobs=[job], choices_per_prompt=1, usage_style=style
    )
    assert orjson.loads(body)["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }


def test_the_plain_finish_closes_made_once_are_the_ones_dumped() -> None:
    """A finishing chunk's close without a stop reason is looked up per finish reason
    (``_PLAIN_FINISH_CLOSES``): the same bytes as dumping both values."""
    from llmsim.api.completions import render

    assert set(render._PLAIN_FINISH_CLOSES) >= {"stop", "length", "abort", "cache_threshold"}
    for reason, close in render._PLAIN_FINISH_CLOSES.items():
        assert close == b',"finish_reason":' + orjson.dumps(reason) + b',"stop_reason":null' + render._CHOICE_REST
