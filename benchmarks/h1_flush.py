"""The flush after an engine step on HTTP/1.1, in process: ``WriteCoalescer.release``,
pure (``connection.PURE_RELEASE``) against its C twin (native/flush.c).

``--connections`` server :class:`~llmsim.protocol.native.connection.Connection` objects,
each with an :class:`~llmsim.protocol.native.http1.Http1Handler` streaming a response
(its head already out) and a real non-blocking socket: one end of a Unix socket pair,
whose other end the driver drains.  A step writes one 230-byte chat chunk to every
response, as the engine's step does (the C ``Http1Response.write``: the chunk into the
handler's batch, the connection deferred on the held coalescer), then releases the
coalescer: every connection's chunk leaves in one ``send(2)``, as in a paced server at
one token per connection per step.  Both twins run on the same connections, steps
interleaved; the CPU time (``time.process_time``) of the releases alone is reported per
token, the system call included (the same for both: the difference is what the C code
saves in user space).  With callgrind (user space only)::

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=dropwhile_next \\
        python -m benchmarks.h1_flush --twin native --steps 20 --quiet

counts the releases alone (each runs inside an ``itertools.dropwhile`` step, as in
``benchmarks.token_path``).

    python -m benchmarks.h1_flush [--connections 1000] [--steps 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import math
import resource
import socket
import time
from collections.abc import Callable

import attrs
import trio

from llmsim.api.http import Application, HttpRequest, ResponseStream
from llmsim.protocol.native.connection import PURE_RELEASE, Connection, ConnectionPhase, WriteCoalescer
from llmsim.protocol.native.frames import chunk
from llmsim.protocol.native.http1 import Http1Handler
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings

__all__ = ["TWINS", "drain", "paired_connection", "raise_fd_limit", "run"]

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)
SSE_HEADERS = ((b"content-type", b"text/event-stream; charset=utf-8"),)
CHUNK = (
    b'data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":1,"model":"m","choices":[{'
    b'"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
).ljust(230)
TWINS: dict[str, Callable[[WriteCoalescer], None]] = {"pure": PURE_RELEASE, "native": WriteCoalescer.release}


@attrs.define(eq=False)
class Streaming:
    """The application: every request gets a streaming response, kept here to write to."""

    responses: list[ResponseStream] = attrs.field(factory=list)

    def start(self, request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, SSE_HEADERS)
        self.responses.append(response)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        raise AssertionError("answered in start")


def paired_connection(
    app: Application, coalescer: WriteCoalescer, settings: ProtocolSettings, tracker: ConnectionTracker
) -> tuple[Connection, socket.socket]:
    """A Connection serving HTTP/1.1 on one end of a non-blocking Unix socket pair, as it
    is once it serves, its writes deferred on ``coalescer`` (no task of its own: the
    driver hands it requests and releases the coalescer); and the other end, the client's."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)
    connection = Connection(stream=None, app=app, settings=settings, tracker=tracker)  # type: ignore[arg-type]
    connection.coalescer = coalescer
    connection._direct = ours
    connection.phase = ConnectionPhase.OPEN
    connection.handler = Http1Handler(connection)
    return connection, peer


def raise_fd_limit() -> None:
    """The soft open-file limit raised to the hard one: 1,000 socket pairs take 2,000."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def drain(peers: list[socket.socket]) -> int:
    """Read everything the peers have; how many bytes."""
    received = 0
    for peer in peers:
        try:
            while piece := peer.recv(1 << 20):
                received += len(piece)
        except BlockingIOError:
            pass
    return received


@attrs.define(eq=False)
class Rig:
    """``count`` connections streaming on socket pairs, deferring on one coalescer."""

    count: int
    app: Streaming = attrs.field(factory=Streaming)
    coalescer: WriteCoalescer = attrs.field(factory=WriteCoalescer)
    connections: list[Connection] = attrs.field(factory=list)
    peers: list[socket.socket] = attrs.field(factory=list)
    ours: list[socket.socket] = attrs.field(factory=list)

    def open(self) -> None:
        settings, tracker = ProtocolSettings(), ConnectionTracker()
        for _ in range(self.count):
            connection, peer = paired_connection(self.app, self.coalescer, settings, tracker)
            assert connection.handler is not None and connection._direct is not None
            connection.handler.receive(REQUEST)  # the application starts the response: its head is in the batch
            connection.flush_now()
            self.connections.append(connection)
            self.ours.append(connection._direct)
            self.peers.append(peer)
        assert len(self.app.responses) == self.count
        self.drain()

    def close(self) -> None:
        for sock in (*self.ours, *self.peers):
            sock.close()

    def drain(self) -> int:
        return drain(self.peers)

    def step(self, release: Callable[[WriteCoalescer], None], callgrind: bool) -> float:
        """Write a chunk to every response, release; the CPU seconds of the release."""
        coalescer = self.coalescer
        coalescer.hold()
        for response in self.app.responses:
            response.write(CHUNK)
        started = time.process_time()
        if callgrind:
            next(itertools.dropwhile(lambda _: release(coalescer), (0,)), None)
        else:
            release(coalescer)
        spent = time.process_time() - started
        assert self.drain() == self.count * len(chunk(CHUNK)), "every connection sent its chunk"
        return spent


def run(connections: int, steps: int, rounds: int, twins: list[str], callgrind: bool = False) -> dict[str, float]:
    """Best µs per token of each twin's releases over ``rounds`` rounds of ``steps`` steps."""
    best = dict.fromkeys(twins, math.inf)

    async def main() -> None:
        rig = Rig(connections)
        rig.open()
        try:
            for _ in range(rounds):
                for name in twins:
                    spent = sum(rig.step(TWINS[name], callgrind) for _ in range(steps))
                    best[name] = min(best[name], spent / (steps * connections) * 1e6)
        finally:
            rig.close()

    trio.run(main)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--twin", choices=[*TWINS, "both"], default="both")
    parser.add_argument("--quiet", action="store_true", help="one round, no output (for callgrind)")
    args = parser.parse_args()
    raise_fd_limit()
    twins = list(TWINS) if args.twin == "both" else [args.twin]
    if args.quiet:
        run(args.connections, args.steps, 1, twins, callgrind=True)
        return
    best = run(args.connections, args.steps, args.rounds, twins)
    for name, cost in best.items():
        print(f"release, {name:6}: {cost:6.3f} µs per token (send included)")
    if len(best) == 2:
        print(f"native / pure: {best['native'] / best['pure']:.3f}; saved {best['pure'] - best['native']:.3f} µs")


if __name__ == "__main__":
    main()
