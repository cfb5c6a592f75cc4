"""The C twin of ``StreamingSink.on_output`` (native/sink.c) against the pure one
(``generation.PURE_ON_OUTPUT``): the same calls on two identical sinks must write the
same bytes, return the same values, pause, fail and log alike; the token case must be
taken in C (no Python frame of the pure twin), and nothing may leak."""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import random
import sys
import tracemalloc
import types
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.api import sse
from llmsim.api.chat.render import ChatStreamRenderer
from llmsim.api.completions.render import CompletionStreamRenderer
from llmsim.api.generation import PURE_ON_OUTPUT, StreamingSink, StreamRenderer
from llmsim.api.sse import PlainTokens
from llmsim.config import Config
from llmsim.engine import Engine
from llmsim.engine.job import Job, JobState
from llmsim.engine.scheduler import PURE_RUN
from llmsim.speedups import NATIVE
from tests.api.fakes import EngineRun, make_job
from tests.protocol.native.test_http1_fastpath import Wire, streaming

pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built (or LLMSIM_PURE=1)")

NATIVE_ON_OUTPUT = StreamingSink.on_output
OnOutput = Callable[..., Any]
TWINS = pytest.mark.parametrize("on_output", [PURE_ON_OUTPUT, NATIVE_ON_OUTPUT], ids=["pure", "native"])
# Quotes, backslashes, control characters, non-ASCII, an EOS, a text too long to be cached.
ESCAPES = ('said "hi"', "\\", "\n", "\x1f\x00", "\u00e9t\u00e9", "\U0001f600", "</s>", "", "x" * 70)
SPECIAL = (*ESCAPES, "\ud800")  # a lone surrogate: orjson refuses it, the stream fails


class Stop(BaseException):
    """Not an Exception (as KeyboardInterrupt, trio.Cancelled): it must get through."""


class Unsure:
    """A write result whose truth value cannot be decided."""

    def __bool__(self) -> bool:
        raise ValueError("undecided")


class RecordingResponse:
    """What of a ResponseStream the sink uses, every call recorded in ``calls``.  write()
    answers from ``answers``, then True: a value, :class:`Unsure`, or an exception
    class to raise.  ``end_raises``: end() raises RuntimeError."""

    def __init__(self, answers: Sequence[object] = (), *, end_raises: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.closed = False
        self.drained: list[Callable[[], None]] = []
        self._answers = iter(answers)
        self._end_raises = end_raises

    def write(self, data: bytes) -> object:
        self.calls.append(("write", type(data), bytes(data)))
        answer = next(self._answers, True)
        if isinstance(answer, type) and issubclass(answer, BaseException):
            raise answer("write failed")
        return Unsure() if answer is Unsure else answer

    def end(self, data: bytes = b"", trailers: object = ()) -> None:
        self.calls.append(("end", data))
        if self._end_raises:
            raise RuntimeError("end failed")
        self.closed = True

    def on_drained(self, callback: Callable[[], None]) -> None:
        self.calls.append(("on_drained",))
        self.drained.append(callback)


class LogRecorder(logging.Handler):
    """llmsim.api's records: level, message, the exception and whether it has its traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[object, ...]] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        traced = exc is not None and exc.__traceback__ is not None
        self.records.append((record.levelname, record.getMessage(), type(exc), str(exc), traced))


class EveryToken(ChatStreamRenderer):
    """A chat renderer without PlainTokens: every call goes through render()."""

    def plain_tokens(self) -> None:
        return None


MAX_RUN = 64  # the most middle tokens one call of the C twin takes (native/sink.c)


def new_sink(response: Any, renderer: StreamRenderer, job_count: int) -> StreamingSink:
    return StreamingSink(response, renderer, job_count, lambda job: None)


def chat(choices: int) -> StreamRenderer:
    return ChatStreamRenderer(response_id="chatcmpl-1", created=1, model="m", choices=choices, include_usage=True)


def completions(choices: int) -> StreamRenderer:
    return CompletionStreamRenderer(
        response_id="cmpl-1", created=1, model="m", choices=choices, choices_per_prompt=choices, include_usage=False
    )


def every_token(choices: int) -> StreamRenderer:
    return EveryToken(response_id="chatcmpl-1", created=1, model="m", choices=choices, include_usage=True)


@contextlib.contextmanager
def pure_frames(code: Any = PURE_ON_OUTPUT.__code__) -> Iterator[list[int]]:
    """Counts the Python frames of the pure twin inside the ``with`` block."""
    count = [0]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is code:
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


def run(
    on_output: OnOutput,
    renderer: Callable[[int], StreamRenderer],
    plans: Sequence[tuple[str, ...]],
    script: Sequence[tuple[int, int]],
    answers: Sequence[object] = (),
) -> tuple[list[Any], int, int]:
    """Drive one sink as the engine does: each step hands ``count`` tokens of choice
    ``choice`` (the last call of a choice FINISHED).  The transcript of everything
    observable, the pure twin's frames, and how many calls the C twin takes itself
    (middle tokens, one or several, or any call once the sink ended)."""
    sse.escape_cache.clear()  # both runs start from the same cache
    response = RecordingResponse(answers)
    sink = new_sink(response, renderer(len(plans)), len(plans))
    jobs = [make_job(sink, plan, index=index) for index, plan in enumerate(plans)]
    transcript: list[Any] = []
    logs = LogRecorder()
    logging.getLogger("llmsim.api").addHandler(logs)
    taken = 0
    try:
        with pure_frames() as frames:
            for choice, count in script:
                job = jobs[choice % len(jobs)]
                if job.done:
                    continue
                start, stop = job.emitted, min(job.emitted + count, len(job.output))
                job.emitted = stop
                job.state = JobState.FINISHED if stop == len(job.output) else JobState.DECODING
                middle = start > 0 and 0 < stop - start <= MAX_RUN and job.state is JobState.DECODING
                taken += sink._ended or (middle and sink._token_opens is not None)
                try:
                    result: object = on_output(sink, job, start, stop, 0.5)
                except (Exception, Stop) as exc:
                    result = (type(exc), str(exc), type(exc.__context__))
                transcript.append((job.index, start, stop, result))
    finally:
        logging.getLogger("llmsim.api").removeHandler(logs)
    state = (sink._ended, sink.ended, [job.index for job in sink._finished], len(sink._paused))
    transcript.append((state, response.calls, logs.records, dict(sse.escape_cache)))
    return transcript, frames[0], taken


def check_twins_agree(
    renderer: Callable[[int], StreamRenderer],
    plans: Sequence[tuple[str, ...]],
    script: Sequence[tuple[int, int]],
    answers: Sequence[object] = (),
) -> list[Any]:
    pure, frames, _ = run(PURE_ON_OUTPUT, renderer, plans, script, answers)
    native, native_frames, taken = run(NATIVE_ON_OUTPUT, renderer, plans, script, answers)
    assert native == pure
    calls = len(pure) - 1
    assert frames == calls
    assert native_frames == calls - taken  # what the C twin takes never enters the pure one
    return native


PIECES = st.one_of(st.sampled_from(SPECIAL), st.text(max_size=4), st.text(min_size=65, max_size=90))
ANSWERS = st.sampled_from([True, True, True, True, False, 0, 1, "", Unsure, ValueError, Stop])


@given(
    renderer=st.sampled_from([chat, completions, every_token]),
    plans=st.lists(st.lists(PIECES, max_size=8).map(tuple), min_size=1, max_size=3),
    script=st.lists(st.tuples(st.integers(0, 2), st.sampled_from([1, 1, 1, 1, 2, 3])), max_size=40),
    answers=st.lists(ANSWERS, max_size=40),
)
def test_the_twins_agree_on_any_stream(
    renderer: Callable[[int], StreamRenderer],
    plans: list[tuple[str, ...]],
    script: list[tuple[int, int]],
    answers: list[object],
) -> None:
    check_twins_agree(renderer, plans, script, answers)


@pytest.mark.parametrize("renderer", [chat, completions])
def test_every_middle_token_is_written_by_the_c_twin(renderer: Callable[[int], StreamRenderer]) -> None:
    """Three choices of every special piece, one token per step: the bytes are render()'s."""
    plans = [("a", *ESCAPES, "z")] * 3
    script = [(choice, 1) for _ in range(len(plans[0])) for choice in range(3)]
    native = check_twins_agree(renderer, plans, script)
    every, _, _ = run(PURE_ON_OUTPUT, every_token if renderer is chat else renderer, plans, script)
    writes = native[-1][1]
    assert b'"said \\"hi\\""' in b"".join(call[-1] for call in writes)
    if renderer is chat:
        assert writes == every[-1][1]


@pytest.mark.parametrize("renderer", [chat, completions])
@pytest.mark.parametrize("count", [2, 3, 64])
def test_several_middle_tokens_are_written_by_the_c_twin_as_render_makes_them(
    renderer: Callable[[int], StreamRenderer], count: int
) -> None:
    """A late step hands a choice several tokens at once: one write of their plain
    events, byte for byte what the renderer's own path (``render``) makes of them."""
    plan = ("a", *ESCAPES, *(f"t{i}" for i in range(70)), "z")
    script = [(0, 1), (0, count), (0, 2), (0, len(plan))]
    native = check_twins_agree(renderer, [plan], script)
    writes = [call[-1] for call in native[-1][1]]
    sink = new_sink(RecordingResponse(), renderer(1), 1)
    job = decoding(sink, plan)
    sink._renderer.render(job, 0, 1)  # (the first: chat's role chunk goes with it)
    assert writes[1] == sink._renderer.render(job, 1, 1 + count)  # (job DECODING: a middle run)
    assert writes[2] == sink._renderer.render(job, 1 + count, 3 + count)


def test_more_tokens_than_the_c_twin_takes_go_to_the_pure_twin() -> None:
    """Over MAX_RUN tokens in one call (a stream paused for long): the pure twin writes them."""
    plan = tuple(f"t{i}" for i in range(80))
    _, frames, taken = run(NATIVE_ON_OUTPUT, chat, [plan], [(0, 1), (0, 65), (0, 2)])
    assert (frames, taken) == (2, 1)  # the first token and the 65; the 2 in C


def test_a_miss_is_escaped_by_sse_escape_and_cached_if_short() -> None:
    sse.escape_cache.clear()
    response = RecordingResponse()
    sink = new_sink(response, chat(1), 1)
    long = "\u00e9" * 65
    job = decoding(sink, ("a", "b\n", long, "c"))
    assert NATIVE_ON_OUTPUT(sink, job, 1, 2, 0.0) is True
    assert NATIVE_ON_OUTPUT(sink, job, 2, 3, 0.0) is True
    assert sse.escape_cache == {"b\n": b"b\\n"}
    assert [call[-1].count(b"\\n") for call in response.calls] == [1, 0]
    assert long.encode() in response.calls[1][-1]


def decoding(sink: StreamingSink, pieces: tuple[str, ...], index: int = 0) -> Job:
    job = make_job(sink, pieces, index=index)
    job.state = JobState.DECODING
    return job


@TWINS
def test_a_write_that_raises_is_logged_once_and_fails_the_stream(on_output: OnOutput) -> None:
    response = RecordingResponse([ValueError])
    sink = new_sink(response, chat(1), 1)
    job = decoding(sink, ("a", "b", "c"))
    logs = LogRecorder()
    logging.getLogger("llmsim.api").addHandler(logs)
    try:
        try:
            raise KeyError("outer")
        except KeyError:
            assert on_output(sink, job, 1, 2, 0.0) is True
            assert sys.exc_info()[0] is KeyError  # the handled exception is the caller's again
        assert on_output(sink, job, 2, 3, 0.0) is True  # ended: nothing more is written
    finally:
        logging.getLogger("llmsim.api").removeHandler(logs)
    assert logs.records == [("ERROR", f"rendering the stream of {job!r} failed", ValueError, "write failed", True)]
    assert [call[0] for call in response.calls] == ["write", "end"]
    assert b'"code":500' in response.calls[1][1]
    assert sink._ended and sink.ended


@TWINS
def test_a_coroutines_handled_exception_is_left_as_it_was(on_output: OnOutput) -> None:
    """A failure handled inside on_output leaves nothing behind in the innermost
    exception state (a generator's here, as the engine task's coroutine)."""
    sink = new_sink(RecordingResponse([ValueError]), chat(1), 1)
    job = decoding(sink, ("a", "b", "c"))

    def steps() -> Iterator[object]:
        yield on_output(sink, job, 1, 2, 0.0)
        yield sys.exc_info()[1]

    step = steps()
    try:
        raise KeyError("outer")
    except KeyError:
        assert next(step) is True
    assert next(step) is None


@TWINS
@pytest.mark.parametrize("exception", [Stop, KeyboardInterrupt])
def test_a_base_exception_from_write_propagates(on_output: OnOutput, exception: type[BaseException]) -> None:
    response = RecordingResponse([exception])
    sink = new_sink(response, chat(1), 1)
    with pytest.raises(exception):
        on_output(sink, decoding(sink, ("a", "b", "c")), 1, 2, 0.0)
    assert not sink._ended
    assert [call[0] for call in response.calls] == ["write"]


@TWINS
def test_an_exception_while_failing_propagates_chained(on_output: OnOutput) -> None:
    response = RecordingResponse([ValueError], end_raises=True)
    sink = new_sink(response, chat(1), 1)
    with pytest.raises(RuntimeError) as raised:
        on_output(sink, decoding(sink, ("a", "b", "c")), 1, 2, 0.0)
    assert type(raised.value.__context__) is ValueError


@TWINS
def test_a_full_buffer_pauses_the_job(on_output: OnOutput) -> None:
    response = RecordingResponse([False, Unsure, True])
    sink = new_sink(response, chat(2), 2)
    first, second = decoding(sink, ("a", "b", "c")), decoding(sink, ("a", "b", "c"), index=1)
    assert on_output(sink, first, 1, 2, 0.0) is False
    assert on_output(sink, second, 1, 2, 0.0) is True  # Unsure: logged, failed
    assert sink._paused == [] and sink._ended  # ended: _end() dropped the paused jobs
    assert [call[0] for call in response.calls] == ["write", "on_drained", "write", "end"]


def test_odd_values_in_the_cache_are_used_as_python_would() -> None:
    """A bytearray is added with ``+``; None counts as a miss (the twin's ``is not None``)."""
    sse.escape_cache.clear()
    cache: dict[str, Any] = sse.escape_cache
    cache.update({"b": bytearray(b"B"), "c": None})
    try:
        results = []
        for on_output in (PURE_ON_OUTPUT, NATIVE_ON_OUTPUT):
            response = RecordingResponse()
            sink = new_sink(response, chat(1), 1)
            job = decoding(sink, ("a", "b", "c", "d"))
            results.append((on_output(sink, job, 1, 2, 0.0), on_output(sink, job, 2, 3, 0.0), response.calls))
        assert results[0] == results[1]
        [(_, first_type, first), (_, _, second)] = results[1][2]
        assert first_type is bytes and b'{"content":"B"}' in first and b'{"content":"c"}' in second
    finally:
        sse.escape_cache.clear()


def test_escape_results_that_are_not_bytes_or_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeOrjson:
        @staticmethod
        def dumps(text: str) -> bytearray:
            if text == "boom":
                raise ValueError("cannot escape")
            return bytearray(b'"' + text.upper().encode() + b'"')

    monkeypatch.setattr(sse, "orjson", FakeOrjson)
    check_twins_agree(chat, [("a", "ba", "boom", "z")], [(0, 1)] * 4)


class SubSink(StreamingSink):
    __slots__ = ()


class SubJob(Job):
    pass


class Pieces(Sequence[str]):
    def __init__(self, *pieces: str) -> None:
        self._pieces = pieces

    def __getitem__(self, index: Any) -> Any:
        return self._pieces[index]

    def __len__(self) -> int:
        return len(self._pieces)


class OddRenderer(ChatStreamRenderer):
    def plain_tokens(self) -> PlainTokens:
        opens: Any = (bytearray(b"<"), b"[")
        return PlainTokens(opens, b">")


def unusual_calls() -> Iterator[tuple[str, Callable[[OnOutput], object]]]:
    """(name, a call of a twin on a fresh sink) for every shape the C path leaves to Python."""

    def call(
        pieces: Sequence[str] = ("a", "b", "c"),
        *,
        sink_class: type[StreamingSink] = StreamingSink,
        job_class: type[Job] = Job,
        renderer: StreamRenderer | None = None,
        index: int = 0,
        args: tuple[object, ...] = (1, 2, 0.0),
        kwargs: dict[str, object] | None = None,
        bound: bool = False,
    ) -> Callable[[OnOutput], object]:
        def go(on_output: OnOutput) -> object:
            response: Any = RecordingResponse()
            sink = sink_class(response, renderer or chat(2), 2, lambda job: None)
            job = job_class(prompt_token_ids=(1,), output=pieces, finish_reason="stop", sink=sink, index=index)
            job.state = JobState.DECODING
            try:
                if bound:
                    result = on_output.__get__(sink)(job, *args, **(kwargs or {}))
                else:
                    result = on_output(sink, job, *args, **(kwargs or {}))
            except Exception as exc:
                result = (type(exc), str(exc))
            return result, response.calls, sink._ended

        return go

    yield "keywords", call(args=(), kwargs={"start": 1, "stop": 2, "now": 0.0})
    yield "too few arguments", call(args=(1, 2))
    yield "bound method", call(bound=True)
    yield "a subclass of the sink", call(sink_class=SubSink)
    yield "a subclass of Job", call(job_class=SubJob)
    yield "output a list", call(["a", "b", "c"])
    yield "output another sequence", call(Pieces("a", "b", "c"))
    yield "a piece not a str", call(("a", 7, "c"))  # type: ignore[arg-type]
    yield (
        "opens not bytes",
        call(renderer=OddRenderer(response_id="c", created=1, model="m", choices=2, include_usage=False)),
    )
    yield "choice index beyond opens", call(index=5)
    yield "negative choice index", call(index=-1)
    yield "start a bool", call(args=(True, 2, 0.0))
    yield "negative start", call(args=(-2, -1, 0.0))
    yield "start beyond the output", call(args=(5, 6, 0.0))
    yield "huge start", call(args=(2**70, 2**70 + 1, 0.0))
    yield "float stop", call(args=(1, 2.0, 0.0))


@pytest.mark.parametrize(("name", "go"), list(unusual_calls()), ids=[name for name, _ in unusual_calls()])
def test_unusual_calls_behave_as_the_pure_twin(name: str, go: Callable[[OnOutput], object]) -> None:
    assert go(NATIVE_ON_OUTPUT) == go(PURE_ON_OUTPUT)


class PureSink(StreamingSink):
    """A sink on the pure twin, beside the C one, in one engine run."""

    __slots__ = ()
    on_output = PURE_ON_OUTPUT


def engine_run(sink_class: type[StreamingSink], high_water: int) -> dict[float, bytes]:
    """What a real Engine's three choices write, by step, to a client that reads slowly."""
    run_ = EngineRun(time_to_first_token=0.1, inter_token_latency=0.01)
    run_.response.reading, run_.response.high_water = False, high_water

    def resume(job: Job) -> None:
        run_.engine.resume(job, run_.now)

    sink = sink_class(run_.response, chat(3), 3, resume)
    run_.submit([make_job(sink, ("a", *ESCAPES, "z"), index=index) for index in range(3)])
    while not sink.ended:
        run_.run()
        run_.now += 0.05
        run_.response.deliver()
    return run_.writes_at()


@pytest.mark.parametrize("high_water", [1, 400, 10**9])
def test_an_engine_run_writes_the_same_through_both_twins(high_water: int) -> None:
    """Pauses and resumes included."""
    pure = engine_run(PureSink, high_water)
    assert engine_run(StreamingSink, high_water) == pure
    assert len(pure) > 10


def test_no_reference_or_memory_leaks() -> None:
    """10,000 calls of each C path (cache hit and miss, written and paused) keep every
    refcount, and the traced memory flat."""
    short, long = "hit", "miss" * 20
    sse.escape_cache.clear()
    sse.escape(short)
    accepted = itertools.cycle((True, False, False))  # each call written and paused
    response: Any = RecordingResponse()
    response.write = lambda data: next(accepted)
    response.on_drained = lambda callback: None
    sink = new_sink(response, chat(1), 1)
    job = decoding(sink, ("a", short, long, "z"))
    opens: Any = sink._token_opens
    watched = (sink, job, response, short, long, sse.escape_cache[short], opens[0], sink._token_close)

    def calls(n: int) -> None:
        for _ in range(n):
            NATIVE_ON_OUTPUT(sink, job, 1, 2, 0.0)
            NATIVE_ON_OUTPUT(sink, job, 2, 3, 0.0)
            sink._paused.clear()

    calls(100)
    gc.collect()
    before = [sys.getrefcount(obj) for obj in watched]
    tracemalloc.start()
    try:
        calls(100)
        first = tracemalloc.get_traced_memory()[0]
        calls(10_000)
        grown = tracemalloc.get_traced_memory()[0] - first
    finally:
        tracemalloc.stop()
    gc.collect()
    assert [sys.getrefcount(obj) for obj in watched] == before
    assert grown < 10_000


def test_the_failure_path_does_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger("llmsim.api"), "disabled", True)
    error = ValueError("write failed")

    def raising(data: bytes) -> bool:
        raise error

    response: Any = RecordingResponse()
    response.write = raising
    sink = new_sink(response, chat(1), 1)
    job = decoding(sink, ("a", "b", "c"))

    def calls(n: int) -> None:
        for _ in range(n):
            sink._ended = False
            response.calls.clear()
            assert NATIVE_ON_OUTPUT(sink, job, 1, 2, 0.0) is True
            error.__traceback__ = None

    calls(100)
    gc.collect()
    before = [sys.getrefcount(obj) for obj in (sink, job, response, error)]
    calls(10_000)
    gc.collect()
    assert [sys.getrefcount(obj) for obj in (sink, job, response, error)] == before
    assert sink._ended


# --- the C engine loop's prefetch hints ------------------------------------------------


class ScriptedSink:
    """A sink of another kind: it records and accepts."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.calls.append((start, stop))
        return True


def mixed_bucket() -> tuple[list[Job], Callable[[], object]]:
    """Jobs of every kind the C engine loop reads ahead through for its prefetch hints
    (native/engine_run.c ``prefetch_ahead``, sink.c ``llmsim_prefetch_output``, the
    h1/h2 write hints): StreamingSinks on recording responses and on a real HTTP/1.1
    response, outputs as tuples and lists, a choice index too large for any tuple, sinks
    of another kind; and what they all wrote, to compare."""
    handler, http1_stream = streaming(Wire())
    jobs: list[Job] = []
    recorded: list[Any] = []
    pieces = tuple(f" t{number}" for number in range(12))
    for number in range(16):
        kind = number % 4
        if kind == 3:
            scripted = ScriptedSink()
            jobs.append(make_job(scripted, pieces))  # type: ignore[arg-type]
            recorded.append(scripted.calls)
            continue
        recording = RecordingResponse()
        sink = new_sink(http1_stream if number == 1 else recording, chat(2), 1)
        job = make_job(sink, pieces, index=2**70 if kind == 2 else number % 2)
        if kind == 1:
            job.output = list(pieces)
        jobs.append(job)
        recorded.append(recording.calls)
    return jobs, lambda: (recorded, http1_stream.state, handler.outgoing())


async def test_the_engine_loops_prefetch_hints_change_nothing() -> None:
    """The same steps over the same mixed bucket, by the C engine loop (which reads ahead
    for its hints) and by the pure one, write the same bytes and leave every job alike."""
    outcomes = []
    for native in (True, False):
        config = Config(time_to_first_token=0.01, inter_token_latency=0.01)
        engine = Engine(config.engine, config.latency, rng=random.Random(3))
        if not native:  # the instance attribute shadows the class's (C) method
            engine._run = types.MethodType(PURE_RUN, engine)  # type: ignore[method-assign]
        jobs, written = mixed_bucket()
        for job in jobs:
            engine.submit(job, 0.0)
        while engine.statistics().running:
            engine.step(engine.next_deadline())
        outcomes.append((written(), [(job.state, job.emitted) for job in jobs]))
    assert outcomes[0] == outcomes[1]
    assert {state for state, _ in outcomes[0][1]} == {JobState.FINISHED}
    assert b"data: " in outcomes[0][0][2]  # the HTTP/1.1 response streamed its tokens
