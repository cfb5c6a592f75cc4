"""The HTTP/1.1 handler's cost per request and per streamed token, in process.

An :class:`~llmsim.protocol.native.http1.Http1Handler` on a fake transport (no socket,
no engine, no nursery) is fed what ``h2load --h1`` sends: one ``POST
/v1/chat/completions`` with a 154-byte JSON body at a time, the next once the previous
response is complete.  Each response is what a paced streaming chat makes: ``start(200,
SSE headers)``, then ``tokens`` writes of a 230-byte chat chunk, then ``end()``, with
``outgoing()`` + ``flushed()`` (what ``Connection.flush_now`` calls after an engine
step) after the head, after each write and after the end.  The request handler task is
run inline (``run_handler``'s coroutine driven by hand), so everything from the request
bytes to the last byte of the response is counted except the trio task itself.

Usage::

    python -m benchmarks.h1_cost --requests 200 --tokens 100         # CPU µs (best of --rounds)
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m benchmarks.h1_cost --requests 200 --tokens 100 --quiet

With callgrind, take the difference of two run lengths (start-up cancels out): per
token, the same ``--requests`` with two ``--tokens``; per request, two ``--requests``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Coroutine
from typing import Any

import attrs
import trio

from benchmarks.fake_transport import FakeTransport
from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.protocol.native.http1 import Http1Handler

BODY = (
    b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":100,"ignore_eos":true}'.ljust(
        154
    )
)
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: h2load nghttp2/1.59.0\r\n"
    b"content-type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)
SSE_HEADERS = ((b"content-type", b"text/event-stream; charset=utf-8"), (b"x-llmsim-version", b"0.0.0"))
CHUNK = (
    b'data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":1,"model":"m","choices":[{'
    b'"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
).ljust(230)


@attrs.define(eq=False)
class PacedChat:
    """The application: one streaming chat of ``tokens`` chunks, flushed step by step."""

    tokens: int
    handler: Http1Handler | None = None
    sent: int = 0  # bytes

    def flush(self) -> None:
        handler = self.handler
        assert handler is not None
        sent = len(handler.outgoing())
        handler.flushed()
        assert sent, "every step sends something"
        self.sent += sent

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, SSE_HEADERS)
        self.flush()
        for _ in range(self.tokens):
            response.write(CHUNK)
            self.flush()
        response.end()


def run_inline(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never blocks to its end, in the calling trio task."""
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("the handler blocked")


def serve(requests: int, tokens: int) -> int:
    """Serve ``requests`` chats of ``tokens`` chunks; the bytes sent."""
    app = PacedChat(tokens)
    spawned: list[Coroutine[Any, Any, None]] = []
    transport = FakeTransport(app, lambda fn, args: spawned.append(fn(*args)))
    handler = Http1Handler(transport)
    app.handler = handler
    for _ in range(requests):
        handler.receive(REQUEST)
        (coro,) = spawned
        spawned.clear()
        run_inline(coro)
        app.flush()  # the end: last chunk, then the next request cycle
    assert transport.tracker.requests_served == requests and not handler.finished
    return app.sent


def measure(requests: int, tokens: int, rounds: int) -> float:
    """Best CPU seconds of ``rounds`` runs."""
    best = math.inf
    for _ in range(rounds):
        started = time.process_time()
        trio.run(_serve_async, requests, tokens)
        best = min(best, time.process_time() - started)
    return best


async def _serve_async(requests: int, tokens: int) -> None:
    serve(requests, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quiet", action="store_true", help="no measurement (for callgrind)")
    args = parser.parse_args()
    if args.quiet:
        trio.run(_serve_async, args.requests, args.tokens)
        return
    short = measure(args.requests, 0, args.rounds)
    full = measure(args.requests, args.tokens, args.rounds)
    per_token = (full - short) / (args.requests * args.tokens) if args.tokens else 0.0
    print(f"per request with 0 tokens:   {short / args.requests * 1e6:8.2f} µs")
    print(f"per token:                   {per_token * 1e6:8.2f} µs")
    print(
        f"per request with {args.tokens} tokens: {full / args.requests * 1e6:8.2f} µs "
        f"({full / args.requests / max(args.tokens, 1) * 1e6:.2f} µs per token)"
    )


if __name__ == "__main__":
    main()
