"""The HTTP/2 request intake of the native server, in process: CPU per request.

An :class:`~llmsim.protocol.native.http2.Http2Handler` on a fake transport (no socket,
no engine) is fed the client bytes of h2load-like requests, 100 per read: a HEADERS
frame with h2load's own header block (captured from ``h2load`` 1.52: ``:path`` and
``content-length`` as literals without indexing, the rest indexed from the second
request on) and a 154-byte DATA frame with END_STREAM.  Each request is
answered as a one-token streaming chat is: ``start(200)``, five SSE events, ``end()``;
then the handler's ``outgoing()`` and ``flushed()`` run once per read.  So what is
measured is the protocol side of a request, from its bytes arriving to its stream
being forgotten: frame parsing, HPACK, h2's stream state, the request head, the
handler task where the server still makes one (``ChatApp``), the response head and
frames (a toy application's work is in it too, but small).

Usage::

    python -m benchmarks.h2_intake --requests 1200            # CPU µs per request, best of 5
    python -m benchmarks.h2_intake --requests 1200 --once     # one run (for callgrind)
    python -m benchmarks.h2_intake --requests 1200 --profile  # cProfile, by own time

Instructions per request (deterministic), as docs/performance.md does it: the
difference of two run lengths under ``valgrind --tool=callgrind``::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.h2_intake --requests 200 --once
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.h2_intake --requests 1200 --once
    # (Collected : instructions) of the second minus the first, over 1,000

The SHA-256 of everything the server sent is printed, so that two versions of the code
can be shown to put the same bytes on the wire.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import pstats
import struct
import time

import attrs
import trio
import trio.testing

from benchmarks.fake_transport import FakeTransport
from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.protocol.native.http2 import Http2Handler

BATCH = 100
BODY = b'{"model": "x", "messages": [{"role": "user", "content": "Hello there, how are you doing today?"}], ' + (
    b'"stream": true, "max_tokens": 1, "ignore_eos": true}   '
)
assert len(BODY) == 154
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# h2load's first frames: SETTINGS (ENABLE_PUSH 0, INITIAL_WINDOW_SIZE 2^30 - 1), a
# connection WINDOW_UPDATE, and the ACK of the server's SETTINGS.
_OPENING = bytes.fromhex("00000c04000000000000020000000000043fffffff0000040800000000003fff0000000000040100000000")
# h2load's header blocks (``content-length: 154`` written without Huffman coding): the
# first request indexes its fields, every later one refers to them.
_FIRST_BLOCK = bytes.fromhex(
    "048e63b85824e34b043d35d05498f52386418b089d5c0b8170dc0bcdb6df837a8f9c541c722954d3a5358980aed897075f8b1d75d0620d263d4c7441ea"
    "0f0d03313534"
)
_LATER_BLOCK = bytes.fromhex("048e63b85824e34b043d35d05498f52386c083bfbe0f0d03313534")
_FRAME = struct.Struct(">HBBBL")
_SSE = ((b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"))
_CHUNK = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","n":%d}\n\n'
_EVENTS = (*(_CHUNK % i for i in range(4)), b"data: [DONE]\n\n")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return _FRAME.pack(len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream_id) + payload


def request_bytes(stream_id: int) -> bytes:
    """One h2load request: HEADERS (END_HEADERS) and DATA (END_STREAM)."""
    block = _FIRST_BLOCK if stream_id == 1 else _LATER_BLOCK
    return _frame(0x1, 0x4, stream_id, block) + _frame(0x0, 0x1, stream_id, BODY)


class ChatApp:
    """Answers every request as a one-token streaming chat does, in ``start`` (a
    ``StartingApplication``, as llmsim's ``Api``: a native server that has
    ``start_handler`` calls it from the reader, with no task; an older one runs
    ``handle`` in a task per request)."""

    served = 0

    def start(self, request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, _SSE)
        for event in _EVENTS:
            response.write(event)
        response.end()
        self.served += 1

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        self.start(request, response)


def client_reads(requests: int) -> list[bytes]:
    """The client's bytes, one read per batch of :data:`BATCH` requests."""
    reads = []
    for first in range(0, requests, BATCH):
        data = b"".join(request_bytes(2 * n + 1) for n in range(first, min(first + BATCH, requests)))
        reads.append(_PREFACE + _OPENING + data if first == 0 else data)
    return reads


@attrs.define
class Run:
    """One run: CPU seconds in all, in ``receive()``, and in ``outgoing()`` + ``flushed()``
    (the rest is the handler tasks and trio); the SHA-256 of the server's output."""

    total: float = 0.0
    receive: float = 0.0
    output: float = 0.0
    digest: str = ""


async def serve(reads: list[bytes], run: Run) -> int:
    """Feed ``reads`` to a handler; the requests served."""
    app = ChatApp()
    digest = hashlib.sha256()
    clock = time.process_time
    async with trio.open_nursery() as nursery:
        handler = Http2Handler(FakeTransport(app, lambda fn, args: nursery.start_soon(fn, *args)))
        for data in reads:
            start = clock()
            handler.receive(data)
            run.receive += clock() - start
            await trio.testing.wait_all_tasks_blocked()
            start = clock()
            digest.update(handler.outgoing())
            handler.flushed()
            run.output += clock() - start
        nursery.cancel_scope.cancel()
    run.digest = digest.hexdigest()
    return app.served


def run_once(requests: int) -> Run:
    reads = client_reads(requests)
    # trio shuffles each batch of runnable tasks; the same order every run makes the
    # output (and the instruction count) the same every run.
    trio._core._run._r.seed(0)
    run = Run()
    start = time.process_time()
    served = trio.run(serve, reads, run)
    run.total = time.process_time() - start
    assert served == requests, f"served {served} of {requests}"
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    parser.add_argument("--once", action="store_true", help="one run (for valgrind)")
    parser.add_argument("--profile", action="store_true", help="cProfile one run, by own time")
    args = parser.parse_args()
    gc.set_threshold(50_000, 20, 100)  # as `llmsim serve` does (llmsim.cli.SERVER_GC_THRESHOLDS)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_once, args.requests)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(35)
        return
    runs = [run_once(args.requests) for _ in range(1 if args.once else args.repeat)]
    best = min(runs, key=lambda run: run.total)
    us = 1e6 / args.requests
    print(f"{args.requests} requests: {best.total * us:.1f} µs CPU per request (best of {len(runs)}), of which")
    print(f"  receive() {best.receive * us:.1f}, outgoing() + flushed() {best.output * us:.1f}, ", end="")
    print(f"the handler tasks and trio {(best.total - best.receive - best.output) * us:.1f}")
    print(f"output sha256 {best.digest}")


if __name__ == "__main__":
    main()
