"""The engine's steps and their flushes on HTTP/1.1, in process, on real connections.

``--streams`` server :class:`~llmsim.protocol.native.connection.Connection` objects, each
with an :class:`~llmsim.protocol.native.http1.Http1Handler` and a real non-blocking socket
(one end of a Unix socket pair, whose other end the driver drains), serve paced streaming
chat requests (TTFT 100 ms, ITL 20 ms, ``--tokens`` each) from the real
:class:`~llmsim.app.Simulator`, on trio's ``MockClock`` (virtual time: no waiting).  The
engine's task holds the connections' write coalescer around every step and releases it
after, as the server does, so every token goes the server's way: ``Engine._run``, the sink,
``Http1Response.write``, ``WriteCoalescer.release`` and one ``send(2)`` per token per
connection.  Requests arrive one every lifetime / streams (virtual) seconds, so about
``streams`` are in flight with random phases, as under a paced load.

Reported: the CPU time (``time.process_time``) of the steps and releases alone, per token
(the Unix socket's ``send()`` included; the intake, the driver and the drain are not), the
best of ``--rounds`` runs.  It is what the per-token path costs in user space and one send,
with 1,000 streams' objects to go through at every step (their cache misses included),
but without the client's load on the machine: run two trees one after the other, several
times, order alternating, to compare them (docs/performance.md, "Issue 16, tenth pass")::

    PYTHONPATH=/tmp/base python -P -m benchmarks.h1_step    # another checkout's llmsim

    python -m benchmarks.h1_step [--streams 1000] [--tokens 100] [--requests 4000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import socket
import time

import attrs
import trio
import trio.testing

from benchmarks.h1_flush import drain, paired_connection, raise_fd_limit
from benchmarks.token_path import ITL, TTFT, h1_request, paced_config
from llmsim.app import Simulator
from llmsim.protocol.native.connection import Connection, WriteCoalescer
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings

__all__ = ["StepClock", "run_once"]

#: How often (virtual seconds) the clients read what their connections sent.
READ_EVERY = 8 * ITL


@attrs.define
class StepClock:
    """The CPU time of the engine's steps and the releases after them."""

    coalescer: WriteCoalescer
    seconds: float = 0.0
    steps: int = 0
    _started: float = 0.0

    def hold(self) -> None:
        self.coalescer.hold()
        self._started = time.process_time()

    def release(self) -> None:
        self.coalescer.release()
        self.seconds += time.process_time() - self._started
        self.steps += 1


def run_once(streams: int, tokens: int, requests: int) -> dict[str, float]:
    """One run: the steps' and releases' CPU µs per token, tokens, steps, bytes the clients got."""
    config = paced_config()
    interval = (TTFT + (tokens - 1) * ITL) / streams
    request = h1_request(tokens)
    result: dict[str, float] = {}

    async def main() -> None:
        sim = Simulator(config)
        settings = ProtocolSettings.from_options(config.server, limits=config.limits)
        tracker = ConnectionTracker()
        clock = StepClock(WriteCoalescer())
        connections: list[Connection] = []
        peers: list[socket.socket] = []
        received = 0

        async def read_as_clients_do() -> None:
            """The clients read every few tokens: a peer read only once per pass over the
            connections would fill a long stream's socket (a Unix socket counts each send's
            buffer overhead too), and nothing here would resume the stream's writes."""
            nonlocal received
            while True:
                await trio.sleep(READ_EVERY)
                received += drain(peers)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: sim.run_engine(hold_writes=clock.hold, release_writes=clock.release))
            for _ in range(streams):
                connection, peer = paired_connection(sim.app, clock.coalescer, settings, tracker)
                connection.spawn = nursery.start_soon
                connections.append(connection)
                peers.append(peer)
            nursery.start_soon(read_as_clients_do)
            gc.collect()
            clock.seconds, clock.steps = 0.0, 0
            try:
                for index in range(requests):
                    connection = connections[index % streams]
                    while connection.handler._response is not None:  # type: ignore[union-attr]
                        await trio.sleep(ITL)
                    clock.coalescer.hold()  # as the reader's hand-over: the head leaves at once
                    connection.handler.receive(request)  # type: ignore[union-attr]
                    clock.coalescer.release()
                    await trio.sleep(interval)
                while sim.engine.statistics().finished < requests:
                    await trio.sleep(ITL)
                received += drain(peers)
            finally:
                for sock in (*peers, *(connection._direct for connection in connections)):
                    if sock is not None:
                        sock.close()
            generated = sim.engine.statistics().generated_tokens
            result.update(
                us_per_token=clock.seconds / generated * 1e6, tokens=generated, steps=clock.steps, bytes=received
            )
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    raise_fd_limit()
    best = min(
        (run_once(args.streams, args.tokens, args.requests) for _ in range(args.rounds)),
        key=lambda run: run["us_per_token"],
    )
    print(
        f"steps and releases: {best['us_per_token']:.3f} µs per token (send included; best of {args.rounds}),"
        f" {best['tokens']:.0f} tokens, {best['steps']:.0f} steps"
    )


if __name__ == "__main__":
    main()
