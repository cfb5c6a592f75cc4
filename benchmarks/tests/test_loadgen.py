"""The load generator's parsers: the measuring instrument must count exactly.

Part of ``make test`` (``testpaths`` in pyproject.toml); on its own:
``python -m pytest benchmarks/tests``.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator

import pytest
import trio

from benchmarks.loadgen.blaster import render_events
from benchmarks.loadgen.http1 import ResponseParser
from benchmarks.loadgen.plan import Plan
from benchmarks.loadgen.records import StreamRecord, chat_body
from benchmarks.loadgen.runner import LoadSpec, _drive
from benchmarks.loadgen.sse import SseReader
from benchmarks.servers import RunningServer, ServerSpec, running


def _pieces(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, 40))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("crlf", [False, True])
def test_sse_reader_counts_content_events_however_the_body_is_split(seed: int, crlf: bool) -> None:
    rng = random.Random(seed)
    body = b"".join(render_events(7))
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    record = StreamRecord(start=0.0)
    reader = SseReader(record)
    for at, piece in enumerate(_pieces(body, rng), start=1):
        reader.feed(piece, float(at))
    reader.finish(99.0)
    assert (record.events, record.tokens, record.done, record.error) == (9, 7, True, None)
    assert len(record.gaps) == record.events - 1


def test_sse_reader_compact_json_and_error_event() -> None:
    record = StreamRecord(start=0.0)
    reader = SseReader(record)
    reader.feed(
        b'data: {"choices":[{"delta":{"content":"[]"}}]}\n\ndata: {"choices":[],"usage":{"completion_tokens":1}}\n\n',
        1.0,
    )
    reader.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n', 2.0)
    reader.finish(3.0)
    assert record.events == 1 and record.tokens == 1 and record.done
    assert record.error is not None and "boom" in record.error


def test_sse_reader_flags_a_stream_without_done() -> None:
    record = StreamRecord(start=0.0)
    reader = SseReader(record)
    reader.feed(b'data: {"choices":[{"delta":{}}]}\n\n', 1.0)
    reader.finish(2.0)
    assert record.error == "stream ended without [DONE]"


@pytest.mark.parametrize("seed", range(20))
def test_http1_parser_dechunks_across_arbitrary_reads(seed: int) -> None:
    rng = random.Random(seed)
    events = render_events(5)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nx-trailer: 1\r\n\r\n"
    parser = ResponseParser(StreamRecord(start=0.0))
    for piece in _pieces(head + body, rng):
        parser.feed(piece, 1.0)
    assert parser.complete and parser.keep_alive
    assert (parser.record.status, parser.record.events, parser.record.tokens, parser.record.error) == (200, 7, 5, None)


def test_http1_parser_error_status_keeps_the_body() -> None:
    body = b'{"error": {"message": "The model `x` does not exist."}}'
    response = b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    parser = ResponseParser(StreamRecord(start=0.0))
    parser.feed(response, 1.0)
    assert parser.complete and not parser.keep_alive
    assert parser.record.status == 404 and "does not exist" in (parser.record.error or "")


@pytest.fixture(scope="module")
def paced_blaster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One paced blaster process (1 ms ITL) for both closed-loop tests."""
    spec = ServerSpec(
        "blaster", (sys.executable, "-m", "benchmarks.loadgen.blaster", "--port", "{port}", "--itl", "0.001")
    )
    with running(spec, tmp_path_factory.mktemp("blaster")) as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("http2", [False, True])
def test_closed_loop_against_the_blaster(paced_blaster: RunningServer, http2: bool) -> None:
    """End to end over loopback (paced blaster): every finished stream is complete and clean."""
    spec = LoadSpec(
        port=paced_blaster.port,
        http2=http2,
        connections=2,
        streams=3 if http2 else 1,
        duration=0.3,  # a stream takes ~25 ms: a dozen per connection and more
        warmup=0.0,
        max_tokens=20,
    )
    start = time.perf_counter()
    plan = Plan(spec.host, spec.port, spec.path, chat_body(spec.model, spec.max_tokens), start + spec.duration)
    trio.run(_drive, spec, 0, plan, start)
    finished = [r for r in plan.records if r.done]
    assert finished and all(r.error is None and r.events == 22 and r.tokens == 20 for r in finished)
    assert min(r.ttft for r in finished) > 0
