"""Where the KV cache's events go (llm-d-inference-sim's ZMQ keys, or vLLM's
``--kv-events-config``), and the data-parallel ranks one process serves.

The events exist only with ``--enable-kvcache`` (or a ``--kv-events-config`` that enables
them); the publisher itself is :mod:`llmsim.kv_events`.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from llmsim.options.fields import ConfigError, JsonObjectText, check_positive, option, option_key

__all__ = ["MAX_DATA_PARALLEL_SIZE", "KvEventsOptions", "VllmKvEventsConfig", "endpoint_port"]

#: llm-d-inference-sim's bound on --data-parallel-size (and on the rank, below it).
MAX_DATA_PARALLEL_SIZE = 8


def endpoint_port(endpoint: str) -> tuple[str, int] | None:
    """``("tcp://host:", 5557)`` for ``tcp://host:5557``: the text up to the last colon and
    the port after it; None when the endpoint does not end in a port (llm-d-inference-sim's
    ``ParseEndpointPort``, ``pkg/common/publisher.go``)."""
    prefix, colon, port = endpoint.rpartition(":")
    if not colon or not port.isdigit():
        return None
    return prefix + colon, int(port)


@attrs.frozen(kw_only=True)
class VllmKvEventsConfig:
    """vLLM 0.33's ``KVEventsConfig`` (``vllm/config/kv_events.py``), read from the JSON of
    ``--kv-events-config``.  ``publisher`` defaults to ``"zmq"`` when events are enabled,
    else ``"null"`` (its ``__post_init__``); ``hwm`` is the PUB socket's send high-water
    mark; ``max_queue_size`` bounds vLLM's queue to its publisher thread, which llmsim
    does not have (accepted, unused)."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def publishes(self) -> bool:
        """Whether vLLM would build a ZMQ publisher (``EventPublisherFactory.create``)."""
        publisher = self.publisher or ("zmq" if self.enable_kv_cache_events else "null")
        return self.enable_kv_cache_events and publisher == "zmq"

    @classmethod
    def from_json(cls, text: str) -> VllmKvEventsConfig:
        """The config in ``text`` (a JSON object); ValueError naming a field vLLM would refuse."""
        given = orjson.loads(text)
        if not isinstance(given, dict):
            raise ValueError("expected a JSON object")
        fields = attrs.fields_dict(cls)
        values: dict[str, Any] = {}
        for name, value in given.items():
            field = fields.get(name)
            if field is None:
                raise ValueError(f"unknown field {name!r}; vLLM's KVEventsConfig has {', '.join(fields)}")
            values[name] = _checked(name, value, field.type)
        config = cls(**values)
        if config.publisher not in (None, "null", "zmq"):
            raise ValueError(f"publisher must be 'null' or 'zmq', got {config.publisher!r}")
        if config.buffer_steps < 1 or config.hwm < 0:
            raise ValueError("buffer_steps must be >= 1 and hwm >= 0")
        for endpoint in (config.endpoint, config.replay_endpoint):
            problem = endpoint is not None and _endpoint_problem(endpoint)
            if problem:
                raise ValueError(problem)
        return config


def _checked(name: str, value: object, annotation: object) -> object:
    """``value`` if it has the field's JSON type (bool is not an int here)."""
    expected: tuple[type, ...] = {
        "bool": (bool,),
        "int": (int,),
        "str": (str,),
        "str | None": (str, type(None)),
    }[str(annotation)]
    if type(value) not in expected:
        raise ValueError(f"{name} must be of type {annotation}, got {value!r}")
    return value


#: The ZMQ transports an endpoint may name.
TRANSPORTS = ("tcp://", "ipc://", "inproc://")


def _endpoint_problem(endpoint: str) -> str | None:
    if not endpoint.startswith(TRANSPORTS) or endpoint.endswith("//"):
        return f"expected a ZMQ endpoint such as tcp://host:5557 (tcp, ipc or inproc), got {endpoint!r}"
    return None


def _check_endpoint(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    problem = value and _endpoint_problem(value)
    if problem:
        raise ConfigError(option_key(attribute), problem)


def _check_rank(instance: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value >= MAX_DATA_PARALLEL_SIZE:
        raise ConfigError(option_key(attribute), f"must be in 0..{MAX_DATA_PARALLEL_SIZE - 1}, got {value}")


def _check_size(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 1 <= value <= MAX_DATA_PARALLEL_SIZE:
        raise ConfigError(option_key(attribute), f"must be in 1..{MAX_DATA_PARALLEL_SIZE}, got {value}")


@attrs.frozen(kw_only=True)
class KvEventsOptions:
    """The KV events publisher (ZMQ PUB), its replay socket (ZMQ ROUTER), and the
    data-parallel ranks."""

    zmq_endpoint: str = option(
        "tcp://127.0.0.1:5557",
        metavar="ENDPOINT",
        validator=_check_endpoint,
        help="where KV events are published (with --enable-kvcache): the PUB socket connects there, "
        "or binds a wildcard address (tcp://*:PORT); empty: not published; the port is offset by the rank",
    )
    event_batch_size: int = option(
        16, metavar="N", validator=check_positive, help="KV events per published batch; a partial one goes out after 1s"
    )
    use_vllm_map_event_format: bool = option(
        False, help="encode events as msgpack maps with field names (vLLM 0.33's format), not positional arrays"
    )
    kv_events_replay_endpoint: str = option(
        "",
        metavar="ENDPOINT",
        shown_default="none",
        validator=_check_endpoint,
        help="bind a ROUTER socket here that sends a client the kept batches from the sequence number it asks for",
    )
    kv_events_replay_queue_size: int = option(
        1024, metavar="BATCHES", validator=check_positive, help="published batches kept for replay"
    )
    kv_events_config: JsonObjectText | None = option(  # noqa: RUF009 (a str: immutable, but a NewType ruff cannot see into)
        None,
        metavar="JSON",
        shown_default="unset",
        llmd=False,
        help="vLLM's KV events config (enable_kv_cache_events, publisher, endpoint, replay_endpoint, "
        "buffer_steps, hwm, topic); it replaces the llm-d keys above, and enable_kv_cache_events turns the "
        "KV cache on",
    )
    data_parallel_size: int = option(
        1,
        metavar="N",
        validator=_check_size,
        help="ranks served by this process on ports port..port+N-1, each with its own engine, KV cache, "
        "metrics and ZMQ endpoints (1..8)",
    )
    data_parallel_rank: int | None = option(
        None,
        metavar="RANK",
        shown_default="unset",
        validator=_check_rank,
        help="serve only this rank (0..7) on --port: its ZMQ endpoints are offset by it and its events "
        "carry it; data-parallel-size then only bounds the ranks' endpoints; negative: unset, as in llm-d",
    )

    def __attrs_post_init__(self) -> None:
        self.vllm_config()  # refuse a bad --kv-events-config at start-up
        self._check_ports_do_not_collide()

    def vllm_config(self) -> VllmKvEventsConfig | None:
        """``--kv-events-config``, read; None when not given."""
        if self.kv_events_config is None:
            return None
        try:
            return VllmKvEventsConfig.from_json(self.kv_events_config)
        except ValueError as exc:
            raise ConfigError("kv-events-config", str(exc)) from None

    def _check_ports_do_not_collide(self) -> None:
        """The PUB and replay ports, offset by every rank 0..size-1, must not meet
        (llm-d-inference-sim's ``validateEndpointPortsDontCollide``: other processes'
        ranks count too, so the whole range is checked even with a rank set)."""
        if not self.zmq_endpoint or not self.kv_events_replay_endpoint:
            return
        published, replay = endpoint_port(self.zmq_endpoint), endpoint_port(self.kv_events_replay_endpoint)
        if published is None or replay is None:
            return
        top = self.data_parallel_size - 1
        if published[1] <= replay[1] + top and replay[1] <= published[1] + top:
            raise ConfigError(
                "kv-events-replay-endpoint",
                f"its port collides with zmq-endpoint's ({self.zmq_endpoint}) once offset by the data-parallel rank",
            )

    @property
    def rank(self) -> int | None:
        """``--data-parallel-rank`` if set (llm-d-inference-sim's -1, or any negative
        rank, means unset)."""
        rank = self.data_parallel_rank
        return rank if rank is not None and rank >= 0 else None

    @property
    def ranks_served(self) -> tuple[int, ...]:
        """The data-parallel ranks this process serves."""
        if self.rank is not None:
            return (self.rank,)
        return tuple(range(self.data_parallel_size))
