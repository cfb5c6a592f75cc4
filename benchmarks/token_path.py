"""In-process cost of a paced streaming request on the native HTTP/2 or HTTP/1.1 handler.

No sockets and no client: ``C`` protocol handlers run on fake transports, the real
:class:`~llmsim.app.Simulator` (engine, API, renderers) behind them, and trio's
``MockClock`` with autojump, so TTFT 100 ms / ITL 20 ms pass in virtual time as fast
as the CPU allows.  Requests arrive one every ``lifetime / streams`` virtual seconds,
round-robin over the connections, so about ``streams`` are in flight with random
phases, as under a paced closed-loop load.  Every request's bytes are built before the
clock starts; what the server writes is counted and dropped (the client's windows are
opened wide, so HTTP/2 flow control never waits).

Reported: CPU (``time.process_time``, GC included) per generated token.  Two lengths
(100 and 400 tokens) give the split ``cpu/token = T + R / tokens``: R per request
(intake, set-up and end), T per token (engine step, render, write, framing, flush).

    python -m benchmarks.token_path                 # HTTP/2 and HTTP/1.1, 1,000 streams
    python -m benchmarks.token_path --protocol h2 --streams 2000 --rounds 5

``--callgrind`` runs once, ``--tokens`` per request, with every engine step and every
connection's flush inside an ``itertools.dropwhile`` step (a C function nothing else
calls), so that callgrind counts the per-token path alone (engine, sink, render,
write, framing, flush: no trio, no driver, no intake); the difference of two lengths
over the extra tokens is the per-token cost (docs/performance.md, "Issue 16, second
pass")::

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=dropwhile_next \
        --callgrind-out-file=OUT python -m benchmarks.token_path --callgrind --protocol h2 \
        --requests 500 --tokens 40        # and --tokens 80; (Ir 80 - Ir 40) / (tokens 80 - tokens 40)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.settings
import trio
import trio.testing

from benchmarks.fake_transport import FakeTransport
from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.protocol.native.http1 import Http1Handler
from llmsim.protocol.native.http2 import Http2Handler
from llmsim.protocol.settings import ProtocolSettings

TTFT = 0.100
ITL = 0.020
#: ``llmsim serve``'s thresholds (cli.SERVER_GC_THRESHOLDS), so the collector costs what it costs there.
GC_THRESHOLDS = (50_000, 20, 100)


def chat_body(max_tokens: int) -> bytes:
    return (
        b'{"model": "bench-model", "messages": [{"role": "user", "content": "hi"}], "stream": true, '
        b'"max_tokens": %d, "ignore_eos": true, "stream_options": {"include_usage": true}}' % max_tokens
    )


@attrs.define(eq=False)
class Connection:
    """A protocol handler on a :class:`FakeTransport`: a wake-up queues it for the
    driver's next flush (as the server's ``WriteCoalescer`` does); output is counted."""

    transport: FakeTransport
    pending: list[Connection]
    handler: Any = None
    dirty: bool = False
    sent: int = 0
    digest: Any = None  # a hashlib object fed every byte sent (run_once's ``digest``), or None

    def wake(self) -> None:
        if not self.dirty:
            self.dirty = True
            self.pending.append(self)

    def flush(self) -> None:
        self.dirty = False
        data = self.handler.outgoing()
        self.sent += len(data)
        if self.digest is not None:
            self.digest.update(data)
        self.handler.flushed()


def paced_config(seed: int | None = None) -> Config:
    """The simulator of the in-process drivers: TTFT 100 ms, ITL 20 ms, room for every stream."""
    return Config(
        seed=seed,
        port=0,
        model="bench-model",
        time_to_first_token=TTFT,
        inter_token_latency=ITL,
        max_num_seqs=12_000,
        max_waiting_queue_length=12_000,
        max_concurrent_streams=1_000,
    )


def h2_requests(count: int, max_tokens: int) -> tuple[bytes, list[bytes]]:
    """The client's preface (windows opened wide) and ``count`` requests, in order."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    client.increment_flow_control_window(2**31 - 1 - 65_535)
    preface = client.data_to_send()
    body = chat_body(max_tokens)
    requests = []
    for index in range(count):
        stream_id = 1 + 2 * index
        headers = [
            (b":method", b"POST"),
            (b":path", b"/v1/chat/completions"),
            (b":scheme", b"http"),
            (b":authority", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        client.send_headers(stream_id, headers)
        client.send_data(stream_id, body, end_stream=True)
        requests.append(client.data_to_send())
    return preface, requests


def h1_request(max_tokens: int) -> bytes:
    body = chat_body(max_tokens)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    return head + body


def run_once(
    protocol: str,
    streams: int,
    connections: int,
    max_tokens: int,
    requests: int,
    *,
    isolate: bool = False,
    digest: bool = False,
) -> dict[str, Any]:
    """One run: CPU seconds per generated token and per request.  ``isolate``: each
    engine step and each flush runs inside ``itertools.dropwhile`` (see ``--callgrind``).
    ``digest``: a seeded simulator with a fixed wall clock, and ``result["digest"]`` the SHA-256 of every
    connection's output in turn: the same bytes whichever code path made them
    (tests/test_speedups.py compares the compiled twins with the pure path by it)."""
    config = paced_config(seed=7 if digest else None)
    lifetime = TTFT + (max_tokens - 1) * ITL
    interval = lifetime / streams
    per_connection = -(-requests // connections)
    if protocol == "h2":
        prepared = [h2_requests(per_connection, max_tokens) for _ in range(connections)]
    else:
        prepared = [(b"", [h1_request(max_tokens)] * per_connection) for _ in range(connections)]
    result: dict[str, float] = {}

    async def main() -> None:
        sim = Simulator(config)
        if digest:
            sim.ctx.wall_clock = lambda: 1_700_000_000.0  # "created": the same second in every run
        settings = ProtocolSettings.from_options(config.server, limits=config.limits)
        pending: list[Connection] = []

        def release() -> None:
            batch = pending[:]
            pending.clear()
            for connection in batch:
                if isolate:
                    _in_dropwhile(connection.flush)
                else:
                    connection.flush()

        def spawn(fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
            nursery.start_soon(fn, *args)

        if isolate:
            step = sim.engine.step
            sim.engine.step = lambda now: _in_dropwhile(lambda: step(now))  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: sim.run_engine(hold_writes=lambda: None, release_writes=release))
            links: list[Connection] = []
            for preface, _ in prepared:
                connection = Connection(FakeTransport(sim.app, spawn, settings=settings), pending)
                connection.digest = hashlib.sha256() if digest else None
                connection.transport.wake = connection.wake
                transport = connection.transport
                connection.handler = Http2Handler(transport) if protocol == "h2" else Http1Handler(transport)
                if preface:
                    connection.handler.receive(preface)
                links.append(connection)
            release()
            gc.collect()
            cpu = time.process_time()
            for index in range(requests):
                link = links[index % connections]
                if protocol == "h1":
                    await _wait_h1_idle(link)
                link.handler.receive(prepared[index % connections][1][index // connections])
                release()
                await trio.sleep(interval)
            while sim.engine.statistics().finished < requests:
                await trio.sleep(ITL)
            cpu = time.process_time() - cpu
            stats = sim.engine.statistics()
            result.update(
                cpu=cpu,
                tokens=stats.generated_tokens,
                requests=stats.finished,
                bytes=sum(link.sent for link in links),
            )
            if digest:
                result["digest"] = hashlib.sha256(b"".join(link.digest.digest() for link in links)).hexdigest()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return result


def _in_dropwhile(call: Callable[[], None]) -> None:
    """``call()`` from inside ``dropwhile``'s C step, which callgrind can toggle on."""
    next(itertools.dropwhile(lambda _: call(), (0,)), None)


async def _wait_h1_idle(link: Connection) -> None:
    """HTTP/1.1 serves one request at a time per connection: wait for the last to end."""
    while link.handler._response is not None:
        await trio.sleep(ITL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("h2", "h1", "both"), default="both")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=0, help="requests per run (default: 3 x streams)")
    parser.add_argument("--callgrind", action="store_true", help="one isolated run for callgrind (see above)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per request, with --callgrind")
    args = parser.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)
    protocols = ("h2", "h1") if args.protocol == "both" else (args.protocol,)
    requests = args.requests or 3 * args.streams
    if args.callgrind:
        for protocol in protocols:
            connections = max(1, args.streams // 50) if protocol == "h2" else args.streams
            run = run_once(protocol, args.streams, connections, args.tokens, requests, isolate=True)
            print(f"{protocol} tokens {run['tokens']:.0f} requests {run['requests']:.0f} bytes {run['bytes']:.0f}")
        return
    print(f"{'protocol':8} {'streams':>7} {'tokens':>6} {'us/token':>9} {'us/request':>10}")
    for protocol in protocols:
        connections = max(1, args.streams // 50) if protocol == "h2" else args.streams
        per_token: dict[int, float] = {}
        for max_tokens in (100, 400):
            best = min(
                (run_once(protocol, args.streams, connections, max_tokens, requests) for _ in range(args.rounds)),
                key=lambda r: r["cpu"] / r["tokens"],
            )
            per_token[max_tokens] = best["cpu"] / best["tokens"] * 1e6
            print(
                f"{protocol:8} {args.streams:>7} {max_tokens:>6} {per_token[max_tokens]:>9.2f} "
                f"{best['cpu'] / best['requests'] * 1e6:>10.1f}"
            )
        request_cost = (per_token[100] - per_token[400]) / (1 / 100 - 1 / 400)
        token_cost = per_token[400] - request_cost / 400
        print(f"{protocol:8} split: T = {token_cost:.2f} us per token, R = {request_cost:.0f} us per request")


if __name__ == "__main__":
    main()
