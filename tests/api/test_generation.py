"""The generation flow every endpoint shares (plan -> submit -> sink), with a renderer
of its own, on trio's mock clock (TTFT 100 ms, ITL 10 ms)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
from trio.testing import MockClock

from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.generation import CollectingSink, build_jobs, collect, stream
from llmsim.api.http import HttpRequest
from llmsim.api.plan import TEXT, Block, GenerationPlan, PromptPlan, TurnPlan
from llmsim.engine.job import Job, JobState
from tests.api.fakes import FakeResponse, running

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}


def text(*pieces: str, finish: str = "stop") -> TurnPlan:
    return TurnPlan(pieces, tuple(range(len(pieces))), finish, (Block(TEXT, 0, len(pieces)),))


class _Renderer:
    """Each event names what it is: the framing is the renderer's business."""

    def head(self) -> bytes:
        return b"head;"

    def render(self, job: Job, start: int, stop: int) -> bytes:
        return b"".join(b"%d:%s;" % (job.index, piece.encode()) for piece in job.output[start:stop])

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
        await stream(Call(sim.ctx, HttpRequest("POST", "/x"), response), plan, _Renderer(), ((b"x-id", b"1"),))
    assert response.status == 200
    assert response.headers == {b"content-type": b"text/event-stream; charset=utf-8", b"x-id": b"1"}
    assert [(round(when - started, 6), data) for when, data in response.writes] == [
        (0.0, b"head;"),
        (0.1, b"0:a;"),
        (0.11, b"0:b;tail(1)"),
    ]
    assert response.ended


async def test_collect_returns_the_finished_jobs_in_choice_order(autojump_clock: MockClock) -> None:
    plan = GenerationPlan("req", (PromptPlan((1, 2, 3), 8),), (text("a", "b", "c"), text("d")), choices_per_prompt=2)
    async with running(**LATENCY) as sim:
        jobs = await collect(Call(sim.ctx, HttpRequest("POST", "/x"), FakeResponse()), plan)
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
            await stream(Call(sim.ctx, HttpRequest("POST", "/x"), response), plan, _Renderer())
        statistics = sim.engine.statistics()
    assert statistics.cancelled == 2 and statistics.running == 0 and statistics.finished == 0
    assert response.body == b"head;0:a;1:d;"
