"""The KV events publisher: a task beside the engine that drains the block pool's events,
batches them and sends them on a ZMQ PUB socket, and answers replay requests on a ZMQ
ROUTER socket.

The engine stays sans-I/O: the pool only records events (``BlockPool.take_events``).
This task takes them every :data:`POLL_INTERVAL` (backing off to :data:`IDLE_POLL_INTERVAL`
while there are none) and never blocks the engine task: both
sockets are used without blocking from trio's thread (a PUB socket drops what it cannot
queue rather than block, the ROUTER's file descriptor is waited on with
``trio.lowlevel.wait_readable``).  See docs/kv-cache.md for the wire format and the
measured cost.

Two sources of settings, each with its own semantics:

* llm-d-inference-sim's keys (``--zmq-endpoint`` and friends): the PUB socket connects
  (binds only a wildcard address), batches hold ``--event-batch-size`` events or go out
  every second, the first seq is 1, and the topic is ``kv@<POD_IP>:<port>@<model>``;
* vLLM's ``--kv-events-config``: vLLM's bind-or-connect rule and port offsets, one batch
  per drain (vLLM sends one per engine step), the first seq is 0, vLLM's map encoding and
  the config's ``topic``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import attrs
import trio
import zmq

from llmsim.engine.kv_cache import BlockPool
from llmsim.kv_events.wire import (
    END_OF_REPLAY,
    EventBatcher,
    ReplayBuffer,
    decode_seq,
    encode_batch,
    encode_event,
    encode_seq,
    llmd_topic,
)
from llmsim.options import ConfigError
from llmsim.options.kv_events import KvEventsOptions, endpoint_port

__all__ = [
    "IDLE_POLL_INTERVAL",
    "LLMD_FLUSH_DELAY",
    "POLL_INTERVAL",
    "KvEventsPublisher",
    "PublisherSettings",
    "publisher_settings",
]

#: How often the task takes the pool's events (seconds).  Events wait at most this long
#: before a full batch goes out; llm-d-inference-sim sends a partial one after a second.
POLL_INTERVAL = 0.02
#: The interval doubles, up to this, while the pool has no events: an idle simulator
#: wakes about 4 times a second rather than 50 (each wake-up costs about 0.25 ms of CPU).
IDLE_POLL_INTERVAL = 0.32
#: llm-d-inference-sim's timer for partial batches (``delay`` in ``block_cache.go``).
LLMD_FLUSH_DELAY = 1.0
#: Replayed batches sent between two checkpoints (sending one takes tens of microseconds).
REPLAY_SLICE = 32
#: Where the topic's address comes from (llm-d-inference-sim's ``POD_IP``).
POD_IP_VARIABLE = "POD_IP"
#: The topic's address when ``POD_IP`` is not set (llm-d-inference-sim refuses to start).
DEFAULT_POD_IP = "127.0.0.1"


@attrs.frozen
class PublisherSettings:
    """What one rank's publisher does, resolved from the options and the rank.

    ``endpoint`` None: the events are taken and dropped (nothing listens).  ``topic`` None:
    llm-d's ``kv@ip:port@model``, built once the serving port is known.
    """

    endpoint: str | None
    bind: bool
    replay_endpoint: str | None
    replay_size: int
    topic: str | None
    batch_size: int | None
    flush_delay: float
    map_format: bool
    first_seq: int
    hwm: int
    rank: int


def publisher_settings(options: KvEventsOptions, rank: int) -> PublisherSettings:
    """The settings of rank ``rank``'s publisher (its endpoints offset by the rank)."""
    vllm = options.vllm_config()
    if vllm is not None:
        endpoint = _vllm_offset(vllm.endpoint, rank) if vllm.publishes else None
        replay = _vllm_offset(vllm.replay_endpoint, rank) if vllm.publishes and vllm.replay_endpoint else None
        return PublisherSettings(
            endpoint=endpoint,
            bind=endpoint is not None and _vllm_binds(endpoint),
            replay_endpoint=replay,
            replay_size=vllm.buffer_steps,
            topic=vllm.topic,
            batch_size=None,
            flush_delay=0.0,
            map_format=True,
            first_seq=0,
            hwm=vllm.hwm,
            rank=rank,
        )
    endpoint = _llmd_offset(options.zmq_endpoint, rank) or None
    return PublisherSettings(
        endpoint=endpoint,
        bind=endpoint is not None and ("*" in endpoint or "::" in endpoint),
        replay_endpoint=_llmd_offset(options.kv_events_replay_endpoint, rank) or None,
        replay_size=options.kv_events_replay_queue_size,
        topic=None,
        batch_size=options.event_batch_size,
        flush_delay=LLMD_FLUSH_DELAY,
        map_format=options.use_vllm_map_event_format,
        first_seq=1,
        hwm=1000,  # ZMQ's default
        rank=rank,
    )


def _llmd_offset(endpoint: str, rank: int) -> str:
    """llm-d-inference-sim's ``OffsetEndpointPort``: the trailing port plus the rank, the
    endpoint unchanged if it has no port (``ipc://...``).  A port of 0 stays 0 (the OS
    picks one), as in vLLM."""
    parsed = endpoint_port(endpoint)
    if parsed is None or parsed[1] == 0 or rank == 0:
        return endpoint
    return f"{parsed[0]}{parsed[1] + rank}"


def _vllm_offset(endpoint: str, rank: int) -> str:
    """vLLM's ``ZmqEventPublisher.offset_endpoint_port`` (``kv_events.py:495-530``)."""
    if rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        return _llmd_offset(endpoint, rank)
    raise ConfigError("kv-events-config", f"endpoint {endpoint!r}: must contain 'inproc' or 'tcp' with rank > 0")


def _vllm_binds(endpoint: str) -> bool:
    """vLLM's ``_is_bind_endpoint``: wildcards and ipc/inproc bind, the rest connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def pod_ip(environ: Mapping[str, str] | None = None) -> str:
    """The address in llm-d topics: ``POD_IP``, else 127.0.0.1."""
    return (os.environ if environ is None else environ).get(POD_IP_VARIABLE) or DEFAULT_POD_IP


class KvEventsPublisher:
    """One rank's publisher over ``pool``.  :meth:`run` is its task (beside the engine's)."""

    def __init__(
        self,
        settings: PublisherSettings,
        pool: BlockPool,
        *,
        model: str,
        port: int,
        pod_ip: str = DEFAULT_POD_IP,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._pool = pool
        self._model = model
        self._pod_ip = pod_ip
        self._clock = clock
        self._wall_clock = wall_clock
        self.topic = settings.topic if settings.topic is not None else llmd_topic(pod_ip, port, model)
        self._topic_bytes = self.topic.encode()
        self._next_seq = settings.first_seq
        self._batcher = EventBatcher(settings.batch_size, settings.flush_delay, clock())
        self._replay = ReplayBuffer(settings.replay_size)
        self._pub: zmq.Socket[bytes] | None = None
        self.bound_endpoint: str | None = None  # the PUB's, once bound
        self.bound_replay_endpoint: str | None = None
        self.batches_published = 0
        self.events_published = 0

    @property
    def last_seq(self) -> int:
        """The seq of the last batch published (``first_seq - 1`` before any)."""
        return self._next_seq - 1

    @property
    def pending(self) -> int:
        """Events taken from the pool and not published yet (a partial batch)."""
        return self._batcher.pending

    def serving_port(self, port: int) -> None:
        """The port the server bound (``--port 0``, a rank's port): llm-d's topic names it."""
        if self.settings.topic is None:
            self.topic = llmd_topic(self._pod_ip, port, self._model)
            self._topic_bytes = self.topic.encode()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the sockets, then publish and answer replays until cancelled."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        pub = replay = None
        try:
            if self.settings.endpoint is not None:
                pub = self._open_pub(context, self.settings.endpoint)
            if self.settings.replay_endpoint is not None:
                replay = self._open_replay(context, self.settings.replay_endpoint)
            self._pub = pub
            async with trio.open_nursery() as nursery:
                if replay is not None:
                    nursery.start_soon(self._serve_replay, replay)
                task_status.started()
                interval = POLL_INTERVAL
                while True:
                    await trio.sleep(interval)
                    interval = POLL_INTERVAL if self.flush() else min(2 * interval, IDLE_POLL_INTERVAL)
                    if self._batcher.pending:  # a partial batch goes out on time
                        interval = min(interval, max(self._batcher.deadline - self._clock(), 0.0))
        finally:
            self._pub = None
            for socket in (pub, replay):
                if socket is not None:
                    socket.close(linger=0)

    def _open_pub(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
        socket = context.socket(zmq.PUB)
        socket.setsockopt(zmq.SNDHWM, self.settings.hwm)
        if self.settings.bind:
            self.bound_endpoint = _bind(socket, endpoint, "the KV events PUB socket")
        else:
            socket.connect(endpoint)  # asynchronous: ZMQ keeps reconnecting on its own
        return socket

    def _open_replay(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
        socket = context.socket(zmq.ROUTER)
        # A whole replay plus its end marker fits (vllm/distributed/kv_events.py:355-357).
        socket.setsockopt(zmq.SNDHWM, 2 * (self.settings.replay_size + 1))
        self.bound_replay_endpoint = _bind(socket, endpoint, "the KV events replay socket")
        return socket

    def flush(self) -> int:
        """Take the pool's events and publish the batches that are due; how many events
        were taken."""
        if self._pub is None and self.settings.endpoint is not None:
            return 0  # the socket opens when run() starts: the events wait in the pool till then
        events = self._pool.take_events()
        if self._pub is None:
            return len(events)  # nowhere to publish: dropped, as llm-d-inference-sim drops them
        map_format = self.settings.map_format
        for batch in self._batcher.add([encode_event(e, map_format=map_format) for e in events], self._clock()):
            self._publish(self._pub, batch)
        return len(events)

    def _publish(self, pub: zmq.Socket[bytes], events: list[object]) -> None:
        payload = encode_batch(self._wall_clock(), events, self.settings.rank)
        seq = self._next_seq
        self._next_seq += 1
        pub.send_multipart((self._topic_bytes, encode_seq(seq), payload), flags=zmq.NOBLOCK)
        if self.settings.replay_endpoint is not None:
            self._replay.store(seq, payload)
        self.batches_published += 1
        self.events_published += len(events)

    async def _serve_replay(self, socket: zmq.Socket[bytes]) -> None:
        """Answer replay requests as they come.  ZMQ's descriptor is edge-triggered: the
        socket's ``EVENTS`` are read (which rearms it) before every wait."""
        descriptor = _int_option(socket, zmq.FD)
        while True:
            while _int_option(socket, zmq.EVENTS) & zmq.POLLIN:
                await self._answer_replay(socket, socket.recv_multipart(zmq.NOBLOCK))
            await trio.lowlevel.wait_readable(descriptor)

    async def _answer_replay(self, socket: zmq.Socket[bytes], frames: list[bytes]) -> None:
        """``[identity, b"", start seq]`` -> every kept batch from that seq, as
        ``[identity, b"", topic, seq, payload]``, then the end marker
        ``[identity, b"", b"", END_OF_REPLAY, b""]``; a malformed request is ignored
        (llm-d-inference-sim ``handleReplayRequest``, vLLM ``_service_replay``)."""
        if len(frames) != 3:
            return
        identity, _, request = frames
        try:
            start = decode_seq(request)
        except ValueError:
            return
        topic = self._topic_bytes
        replies = [(identity, b"", topic, encode_seq(seq), payload) for seq, payload in self._replay.since(start)]
        replies.append((identity, b"", b"", END_OF_REPLAY, b""))
        try:
            for index, reply in enumerate(replies, 1):
                socket.send_multipart(reply, flags=zmq.NOBLOCK)
                if index % REPLAY_SLICE == 0:
                    await trio.lowlevel.checkpoint()  # a long replay must not hold up the engine task
        except zmq.ZMQError:
            return  # the client went away, or stopped reading a whole replay: it asks again


def _bind(socket: zmq.Socket[bytes], endpoint: str, what: str) -> str:
    """Bind ``socket``; the endpoint it is bound to (``tcp://*:0`` gets a port), or an
    OSError naming it (closing the socket)."""
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as exc:
        socket.close(linger=0)
        raise OSError(exc.errno, f"cannot bind {what} at {endpoint}: {exc}") from None
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)


def _int_option(socket: zmq.Socket[bytes], option: int) -> int:
    value = socket.getsockopt(option)
    if not isinstance(value, int):
        raise TypeError(f"ZMQ option {option} is not an integer: {value!r}")
    return value
