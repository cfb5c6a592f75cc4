"""The generation flow every endpoint shares (plan -> submit -> sink), with a renderer
of its own, on trio's mock clock (TTFT 100 ms, ITL 10 ms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest
import trio
from trio.testing import MockClock

from llmsim._version import __version__
from llmsim.api.chat.render import ChatStreamRenderer
from llmsim.api.completions.render import CompletionStreamRenderer
from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.generation import (
    CollectingSink,
    StreamingSink,
    StreamRenderer,
    SubmittedJobs,
    build_jobs,
    stream,
    stream_to_end,
    submit_collected,
)
from llmsim.api.http import HttpRequest
from llmsim.api.plan import GenerationPlan, PromptPlan
from llmsim.api.sse import PlainTokens
from llmsim.api.turns import TEXT, Block, TurnPlan
from llmsim.engine.job import Job, JobState
from tests.api.fakes import EngineRun, FakeResponse, make_job, post, running

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}


def text(*pieces: str, finish: str = "stop") -> TurnPlan:
    return TurnPlan(pieces, tuple(range(len(pieces))), finish, (Block(TEXT, 0, len(pieces)),))


class _Renderer:
    """Each event names what it is: the framing is the renderer's business."""

    def head(self) -> bytes:
        return b"head;"

    def render(self, job: Job, start: int, stop: int) -> bytes:
        return b"".join(b"%d:%s;" % (job.index, piece.encode()) for piece in job.output[start:stop])

    def plain_tokens(self) -> PlainTokens | None:
        return None

    def tail(self, jobs: Sequence[Job]) -> bytes:
        return b"tail(%d)" % len(jobs)

    def error(self, error: ApiError) -> bytes:
        return b"error(%d)" % error.status


def test_choice_i_answers_prompt_i_div_n_with_its_cap() -> None:
    turns = [text("a"), text("b", "c"), text("d", finish="length"), text()]
    plan = GenerationPlan("req", (PromptPlan((1, 2), 10), PromptPlan((3, 4, 5), 9)), turns, choices_per_prompt=2)
    jobs = build_jobs(plan, CollectingSink(4))
    assert [job.index for job in jobs] == [0, 1, 2, 3]
    assert [tuple(job.prompt_token_ids) for job in jobs] == [(1, 2), (1, 2), (3, 4, 5), (3, 4, 5)]
    assert [job.max_tokens for job in jobs] == [10, 10, 9, 9]
    assert [(tuple(job.output), tuple(job.output_token_ids), job.finish_reason) for job in jobs] == [
        (turn.pieces, turn.token_ids, turn.finish_reason) for turn in turns
    ]
    assert {job.request_id for job in jobs} == {"req"}


def test_a_plan_answers_every_prompt_with_one_id_per_piece() -> None:
    with pytest.raises(ValueError, match="1 choices for 1 prompts of 2 choices each"):
        GenerationPlan("req", (PromptPlan((1, 2), 10),), (text("a"),), choices_per_prompt=2)
    with pytest.raises(ValueError, match="2 pieces but 1 token ids"):
        TurnPlan(("a", "b"), (1,), "stop", (Block(TEXT, 0, 2),))


async def test_stream_sends_the_head_at_once_then_each_step(autojump_clock: MockClock) -> None:
    plan = GenerationPlan("req", (PromptPlan((1, 2, 3), 8),), (text("a", "b"),))
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        await stream_to_end(Call(sim.ctx, HttpRequest("POST", "/x"), response), plan, _Renderer(), ((b"x-id", b"1"),))
    assert response.status == 200
    assert response.headers == {
        b"content-type": b"text/event-stream; charset=utf-8",
        b"x-llmsim-version": __version__.encode(),
        b"x-id": b"1",
    }
    assert [(round(when - started, 6), data) for when, data in response.writes] == [
        (0.0, b"head;"),
        (0.1, b"0:a;"),
        (0.11, b"0:b;tail(1)"),
    ]
    assert response.ended


async def test_collect_returns_the_finished_jobs_in_choice_order(autojump_clock: MockClock) -> None:
    plan = GenerationPlan("req", (PromptPlan((1, 2, 3), 8),), (text("a", "b", "c"), text("d")), choices_per_prompt=2)
    async with running(**LATENCY) as sim:
        jobs = await submit_collected(Call(sim.ctx, HttpRequest("POST", "/x"), FakeResponse()), plan).finished()
        statistics = sim.engine.statistics()
    assert [(job.index, job.state, job.emitted) for job in jobs] == [
        (0, JobState.FINISHED, 3),
        (1, JobState.FINISHED, 1),
    ]
    assert statistics.finished == 2 and statistics.running == 0


async def test_leaving_early_cancels_every_unfinished_job(autojump_clock: MockClock) -> None:
    plan = GenerationPlan("req", (PromptPlan((1, 2, 3), 8),), (text("a", "b", "c"), text("d", "e")), 2)
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        with trio.move_on_after(0.105):  # the client goes away after the first token
            await stream_to_end(Call(sim.ctx, HttpRequest("POST", "/x"), response), plan, _Renderer())
        statistics = sim.engine.statistics()
    assert statistics.cancelled == 2 and statistics.running == 0 and statistics.finished == 0
    assert response.body == b"head;0:a;1:d;"


async def test_a_refusal_streams_only_the_error_and_submits_nothing(autojump_clock: MockClock) -> None:
    # what vLLM's engine refuses as it takes a streaming request arrives in-band, in a 200
    # (vllm/entrypoints/openai/chat_completion/serving.py:572-587,951-953)
    plan = GenerationPlan("req", (PromptPlan((1, 2, 3), 8),), (text("a", "b"),))
    response = FakeResponse()
    refusal = ApiError(400, "no")
    async with running(**LATENCY) as sim:
        assert stream(Call(sim.ctx, HttpRequest("POST", "/x"), response), plan, _Renderer(), refusal=refusal) is None
        with pytest.raises(ApiError) as caught:
            submit_collected(Call(sim.ctx, HttpRequest("POST", "/x"), FakeResponse()), plan, refusal=refusal)
        statistics = sim.engine.statistics()
    assert (response.status, response.body, response.ended) == (200, b"head;error(400)", True)
    assert caught.value is refusal
    assert statistics.submitted == 0


# --- the two queue limits -----------------------------------------------------------------------

CHAT = "/v1/chat/completions"
HELLO = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
#: vLLM's QueueOverflowError as create_error_response renders it: 503, type the status
#: phrase, no param (vllm/exceptions.py:147-160; serve/exception_handling/error_response.py:38-41)
OVERFLOW = {
    "message": "The engine is currently busy and cannot accept new requests. Please try again later or on a "
    "different instance.",
    "type": "Service Unavailable",
    "param": None,
    "code": 503,
}
WAITING_FULL = {
    "message": "Failed to enqueue request, waiting requests queue is full",
    "type": "RateLimitError",
    "param": None,
    "code": 429,
}


async def while_one_runs(sim: Any, path: str, body: dict[str, Any]) -> FakeResponse:
    """``body`` posted while one streaming chat request holds a slot (TTFT 10 s)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, sim, CHAT, {**HELLO, "stream": True})
        await trio.testing.wait_all_tasks_blocked()
        response = await post(sim, path, body)
        nursery.cancel_scope.cancel()
    return response


@pytest.mark.parametrize("stream", [False, True])
async def test_max_num_queued_reqs_overflow_is_vllms_503_before_the_first_byte(
    stream: bool, autojump_clock: MockClock
) -> None:
    # vLLM's _preflight -> AsyncLLM.check_admission: in flight + n > max_num_queued_reqs
    # (vllm/entrypoints/generate/base/serving.py:169-181, vllm/v1/engine/async_llm.py:352-369)
    async with running(max_num_queued_reqs=1, time_to_first_token=10.0) as sim:
        refused = await while_one_runs(sim, CHAT, {**HELLO, "stream": stream})
        statistics = sim.engine.statistics()
    assert refused.status == 503 and refused.writes[0][1] == refused.body
    assert refused.body == orjson.dumps({"error": OVERFLOW})
    assert (statistics.submitted, statistics.rejected) == (1, 0)


async def test_a_request_of_n_choices_counts_n_against_max_num_queued_reqs(autojump_clock: MockClock) -> None:
    async with running(max_num_queued_reqs=3) as sim:
        refused = await post(sim, CHAT, {**HELLO, "n": 4})
        huge = await post(sim, "/v1/completions", {"prompt": "x", "n": 10**9, "max_tokens": 2})
        fits = await post(sim, CHAT, {**HELLO, "n": 3})
    assert refused.json()["error"] == OVERFLOW and huge.json()["error"] == OVERFLOW
    assert fits.status == 200 and len(fits.json()["choices"]) == 3


@pytest.mark.parametrize(
    ("limits", "status", "error"),
    [
        # the waiting queue is full before the in-flight cap is reached: llm-d's 429
        ({"max_num_seqs": 1, "max_waiting_queue_length": 0, "max_num_queued_reqs": 5}, 429, WAITING_FULL),
        # the in-flight cap is reached first: vLLM's 503
        ({"max_num_seqs": 1, "max_waiting_queue_length": 10, "max_num_queued_reqs": 1}, 503, OVERFLOW),
        # both at once: vLLM's check comes first (it runs before planning)
        ({"max_num_seqs": 1, "max_waiting_queue_length": 0, "max_num_queued_reqs": 1}, 503, OVERFLOW),
    ],
)
async def test_whichever_queue_limit_is_hit_decides_the_status(
    limits: dict[str, int], status: int, error: dict[str, Any], autojump_clock: MockClock
) -> None:
    async with running(time_to_first_token=10.0, **limits) as sim:
        refused = await while_one_runs(sim, CHAT, {**HELLO, "stream": True})
    assert refused.status == status and refused.json()["error"] == error


async def test_responses_and_messages_overflow_too(autojump_clock: MockClock) -> None:
    async with running(max_num_queued_reqs=1, time_to_first_token=10.0) as sim:
        responses = await while_one_runs(sim, "/v1/responses", {"input": "Hi", "stream": True})
        messages = await while_one_runs(
            sim, "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        )
    assert responses.status == 503 and responses.json()["error"] == OVERFLOW
    # Anthropic's envelope; vLLM maps 503 to overloaded_error (vllm/entrypoints/anthropic/protocol.py:34-43)
    assert messages.status == 503
    assert messages.json() == {"type": "error", "error": {"type": "overloaded_error", "message": OVERFLOW["message"]}}


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_several_middle_tokens_in_one_call_are_what_the_renderer_makes_of_them(kind: str) -> None:
    """A step that came late hands a choice every token due: the sink writes their plain
    events itself (``StreamingSink._token_events``), the very bytes of ``render``."""

    def renderer() -> StreamRenderer:
        if kind == "chat":
            return ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False)
        return CompletionStreamRenderer(
            response_id="cmpl-1", created=1, model="m", choices=1, choices_per_prompt=1, include_usage=False
        )

    pieces = ("a", 'say "hi"', "\n", "", "é", "b", "c")
    response = FakeResponse(lambda: 0.0)
    response.start(200, [])
    sink = StreamingSink(response, renderer(), 1, lambda job: None)
    job = Job(prompt_token_ids=(1,), output=pieces, finish_reason="stop", sink=sink, request_id="1")
    reference = renderer()
    expected = []
    job.state = JobState.DECODING
    for start, stop in ((0, 1), (1, 5), (5, 6)):
        assert sink.on_output(job, start, stop, 0.0)
        expected.append(reference.render(job, start, stop))
    assert [data for _, data in response.writes] == expected
    assert expected[1].count(b"data: ") == 4


class _FailingRenderer(_Renderer):
    """Fails on choice 0's second token (a rendering bug, mid-step)."""

    def render(self, job: Job, start: int, stop: int) -> bytes:
        if job.index == 0 and start > 0:
            raise RuntimeError("renderer bug")
        return super().render(job, start, stop)


@pytest.mark.parametrize(
    ("how", "ended_at", "finished", "cancelled"),
    [("finished", 0.12, 2, 0), ("failed", 0.11, 1, 1), ("stopped", 0.1, 1, 1)],
)
def test_on_end_runs_once_however_the_stream_ends_and_leaves_the_jobs(
    how: str, ended_at: float, finished: int, cancelled: int
) -> None:
    """The sink calls ``on_end`` once: as its last job finished, as it failed (mid-step,
    inside the failing job's own sink call: the engine allows the cancel there), or at
    ``stop`` (the client's close); ``stop`` after that does nothing."""
    run = EngineRun(**LATENCY)
    sink = run.streaming_sink(_FailingRenderer() if how == "failed" else _Renderer(), 2)
    jobs = [make_job(sink, ("a", "b", "c"), index=0), make_job(sink, ("d",), index=1)]
    submitted = SubmittedJobs(run.engine, jobs, lambda: run.now)
    submitted.submit()
    calls: list[float] = []

    def on_end() -> None:
        calls.append(run.now)
        submitted.leave()

    sink.on_end = on_end
    if how == "stopped":
        run.step_to(0.1)
        sink.stop()
    run.run()
    sink.stop()
    statistics = run.engine.statistics()
    assert calls == [pytest.approx(ended_at)] and sink.ended
    assert (statistics.finished, statistics.cancelled, statistics.running) == (finished, cancelled, 0)


def test_an_on_end_that_raises_is_logged_and_the_engine_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """``on_end`` runs inside the engine's step (the last job's sink call): what it raises
    is logged there, never raised into the step, which serves every other stream too."""
    run = EngineRun(**LATENCY)
    sink = run.streaming_sink(_Renderer(), 1)
    other = run.streaming_sink(_Renderer(), 1)

    def broken() -> None:
        raise RuntimeError("on_end bug")

    sink.on_end = broken
    run.submit([make_job(sink, ("a", "b")), make_job(other, ("c", "d", "e"), index=0)])
    run.run()
    assert sink.ended and other.ended
    assert "ending the request of a stream failed" in caplog.text and "on_end bug" in caplog.text
    assert run.engine.statistics().finished == 2
