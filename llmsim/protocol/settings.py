"""Limits the connection handlers enforce, and the counters every server reports.

:class:`ProtocolSettings` is what ``protocol/`` needs from :class:`~llmsim.options.ServerOptions`
(plus a few fixed protocol constants), so the handlers can be built and tested without
a whole configuration.  :class:`ConnectionTracker`, :class:`ServerStatistics` and
:class:`ServerHandle` are shared by the native server and the hypercorn adapter: both
count the same things and report the same handle to ``nursery.start``.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from llmsim.options import LimitOptions, ServerOptions

if TYPE_CHECKING:
    from llmsim.protocol.native.faulty import FaultInjection

__all__ = [
    "BUFFER_HIGH_WATER",
    "BUFFER_LOW_WATER",
    "MAX_HEADER_BYTES",
    "ConnectionTracker",
    "EngineLoad",
    "ProtocolSettings",
    "ServerHandle",
    "ServerStatistics",
]

#: A stream's ``write`` returns False once this many bytes wait to be sent ...
BUFFER_HIGH_WATER = 64 * 1024
#: ... and its ``on_drained`` callbacks run once fewer than this many are left.
BUFFER_LOW_WATER = 16 * 1024
#: Request line plus headers (HTTP/1.1), or the decoded header list (HTTP/2).
MAX_HEADER_BYTES = 64 * 1024
#: How long a closing connection waits for the peer to read the last bytes and close.
CLOSE_LINGER = 1.0
#: HTTP/1.1 bytes a client may pipeline while a response is streaming before we stop reading.
MAX_PIPELINED_BYTES = 64 * 1024


@attrs.frozen(kw_only=True)
class ProtocolSettings:
    """The protocol layer's view of the configuration.  Durations are seconds."""

    header_read_timeout: float = 10.0
    keep_alive_timeout: float = 75.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_concurrent_streams: int = 1000
    shutdown_grace_period: float = 5.0
    high_water: int = BUFFER_HIGH_WATER
    low_water: int = BUFFER_LOW_WATER
    max_header_bytes: int = MAX_HEADER_BYTES
    close_linger: float = CLOSE_LINGER
    max_pipelined_bytes: int = MAX_PIPELINED_BYTES
    body_read_timeout: float = 30.0  # from the request head to the end of its body (HTTP/1.1)
    allow_cleartext: bool = False  # with TLS: also serve cleartext HTTP/1.1 and h2c
    # HTTP/2 abuse limits (LimitOptions): control frames and resets a second (bursts of 10 s'
    # worth), unread acknowledgements, and how long a response may wait for a silent reader.
    h2_control_frame_rate: int = 100
    h2_reset_rate: int = 100
    h2_max_queued_control_frames: int = 1000
    write_stall_timeout: float = 30.0
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, eq=False)
    # Fault injection (--fault, and the count of injected faults): native server only.
    faults: FaultInjection | None = attrs.field(default=None, eq=False)

    @classmethod
    def from_options(
        cls,
        options: ServerOptions,
        ssl_context: ssl.SSLContext | None = None,
        limits: LimitOptions | None = None,
    ) -> ProtocolSettings:
        limits = limits or LimitOptions()
        return cls(
            body_read_timeout=limits.body_read_timeout,
            allow_cleartext=limits.allow_cleartext,
            h2_control_frame_rate=limits.h2_control_frame_rate,
            h2_reset_rate=limits.h2_reset_rate,
            h2_max_queued_control_frames=limits.h2_max_queued_control_frames,
            write_stall_timeout=limits.write_stall_timeout,
            header_read_timeout=options.header_read_timeout,
            keep_alive_timeout=options.keep_alive_timeout,
            max_body_bytes=options.max_request_body_bytes,
            max_concurrent_streams=options.max_concurrent_streams,
            shutdown_grace_period=options.shutdown_grace_period,
            ssl_context=ssl_context,
        )


@attrs.frozen
class EngineLoad:
    """What the application behind the server reports of its engine: the same counters
    ``GET /metrics`` reads (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
    ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total`` and the sum of
    ``vllm:request_success_total``)."""

    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0


@attrs.frozen
class ServerStatistics:
    """A snapshot of a running server (connections and streams of both protocols) and
    of its engine (see :class:`EngineLoad`)."""

    open_connections: int
    active_streams: int
    requests_served: int
    running: int
    waiting: int
    prompt_tokens: int
    generation_tokens: int
    requests_finished: int


def _no_load() -> EngineLoad:
    return EngineLoad()


@attrs.define(eq=False)
class ConnectionTracker:
    """Live counters, updated by the connection handlers.

    ``load`` reports the engine's :class:`EngineLoad` when a snapshot is taken.
    A stream is active from its request head until its response ends or is reset;
    ``requests_served`` counts responses sent to the end.
    """

    load: Callable[[], EngineLoad] = _no_load
    open_connections: int = 0
    active_streams: int = 0
    requests_served: int = 0

    def connection_opened(self) -> None:
        self.open_connections += 1

    def connection_closed(self) -> None:
        self.open_connections -= 1

    def stream_opened(self) -> None:
        self.active_streams += 1

    def stream_closed(self) -> None:
        self.active_streams -= 1

    def request_served(self) -> None:
        self.requests_served += 1

    def statistics(self) -> ServerStatistics:
        load = self.load()
        return ServerStatistics(
            open_connections=self.open_connections,
            active_streams=self.active_streams,
            requests_served=self.requests_served,
            running=load.running,
            waiting=load.waiting,
            prompt_tokens=load.prompt_tokens,
            generation_tokens=load.generation_tokens,
            requests_finished=load.requests_finished,
        )


@attrs.define(eq=False)
class ServerHandle:
    """What ``await nursery.start(serve, config)`` returns: where the server listens."""

    host: str
    port: int
    url: str  # "http://127.0.0.1:PORT", or "https://..." with TLS
    tracker: ConnectionTracker = attrs.field(repr=False)

    def statistics(self) -> ServerStatistics:
        return self.tracker.statistics()
