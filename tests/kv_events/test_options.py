"""The KV events and data-parallel keys (llmsim/options/kv_events.py) and what each rank's
publisher does with them (``publisher_settings``)."""

from __future__ import annotations

import pytest
import trio

from llmsim.config import IGNORED_KEYS, Config, ConfigError, load_config
from llmsim.kv_events import pod_ip, publisher_settings
from llmsim.server import DataParallelHandle, serve


def test_defaults_are_llm_ds() -> None:
    """``newConfig`` in llm-d-inference-sim pkg/common/config.go."""
    options = Config().kv_events
    assert (options.zmq_endpoint, options.event_batch_size, options.kv_events_replay_queue_size) == (
        "tcp://127.0.0.1:5557",
        16,
        1024,
    )
    assert (options.data_parallel_size, options.data_parallel_rank, options.ranks_served) == (1, None, (0,))
    for key in ("zmq-endpoint", "event-batch-size", "data-parallel-size", "data-parallel-rank"):
        assert key not in IGNORED_KEYS
    assert "zmq-max-connect-attempts" in IGNORED_KEYS  # read by no current llm-d release


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"event_batch_size": 0}, "event-batch-size"),
        ({"kv_events_replay_queue_size": 0}, "kv-events-replay-queue-size"),
        ({"data_parallel_size": 9}, "data-parallel-size"),
        ({"data_parallel_size": 0}, "data-parallel-size"),
        ({"data_parallel_rank": 8}, "data-parallel-rank"),
        ({"kv_events_config": '{"endpointt": "tcp://*:1"}'}, "kv-events-config"),
        ({"kv_events_config": '{"buffer_steps": "10"}'}, "kv-events-config"),
        ({"kv_events_config": '{"publisher": "kafka"}'}, "kv-events-config"),
        ({"kv_events_config": '{"endpoint": "localhost:5557"}'}, "kv-events-config"),
        ({"zmq_endpoint": "127.0.0.1:5557"}, "zmq-endpoint"),
        ({"kv_events_replay_endpoint": "tcp://"}, "kv-events-replay-endpoint"),
        # 5557 and 5558 meet once rank 1 offsets the first (validateEndpointPortsDontCollide)
        (
            {"zmq_endpoint": "tcp://h:5557", "kv_events_replay_endpoint": "tcp://*:5558", "data_parallel_size": 2},
            "kv-events-replay-endpoint",
        ),
    ],
)
def test_bad_values_are_refused(settings: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Config(**settings)


def test_ports_that_do_not_collide_are_accepted() -> None:
    Config(zmq_endpoint="tcp://h:5557", kv_events_replay_endpoint="tcp://*:5558")
    Config(zmq_endpoint="tcp://h:5557", kv_events_replay_endpoint="tcp://*:5567", data_parallel_size=8)


def test_flags_read_as_llm_d_reads_them() -> None:
    config = load_config({"use-vllm-map-event-format": "true", "data-parallel-rank": "3", "event-batch-size": "4"})
    assert config.kv_events.use_vllm_map_event_format and config.kv_events.ranks_served == (3,)
    assert config.kv_events.event_batch_size == 4
    assert load_config({"data-parallel-rank": "-1", "data-parallel-size": "3"}).kv_events.ranks_served == (0, 1, 2)


def test_llm_d_settings_offset_the_ports_by_the_rank() -> None:
    """``OffsetEndpointPort``; the PUB connects unless the address is a wildcard."""
    options = Config(kv_events_replay_endpoint="tcp://*:6000").kv_events
    zero, two = publisher_settings(options, 0), publisher_settings(options, 2)
    assert (zero.endpoint, zero.bind, zero.replay_endpoint) == ("tcp://127.0.0.1:5557", False, "tcp://*:6000")
    assert (two.endpoint, two.replay_endpoint, two.rank) == ("tcp://127.0.0.1:5559", "tcp://*:6002", 2)
    assert (two.batch_size, two.flush_delay, two.first_seq, two.map_format, two.topic) == (16, 1.0, 1, False, None)
    ipc = publisher_settings(Config(zmq_endpoint="ipc:///tmp/x", kv_events_replay_endpoint="").kv_events, 3)
    assert (ipc.endpoint, ipc.replay_endpoint) == ("ipc:///tmp/x", None)
    assert publisher_settings(Config(zmq_endpoint="tcp://*:0").kv_events, 1).endpoint == "tcp://*:0"
    assert publisher_settings(Config(zmq_endpoint="tcp://*:7").kv_events, 0).bind
    assert publisher_settings(Config(zmq_endpoint="").kv_events, 1).endpoint is None


def test_vllm_settings_follow_vllm() -> None:
    """``ZmqEventPublisher``: bind wildcards and ipc, offset tcp ports, suffix inproc."""
    text = '{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:5600", "buffer_steps": 5, "topic": "t"}'
    options = Config(kv_events_config=text).kv_events
    one = publisher_settings(options, 1)
    assert (one.endpoint, one.bind, one.replay_endpoint, one.replay_size) == ("tcp://*:5558", True, "tcp://*:5601", 5)
    assert (one.topic, one.batch_size, one.flush_delay, one.first_seq, one.map_format) == ("t", None, 0.0, 0, True)
    inproc = Config(kv_events_config='{"enable_kv_cache_events": true, "endpoint": "inproc://ev"}').kv_events
    assert publisher_settings(inproc, 2).endpoint == "inproc://ev_dp2"
    assert publisher_settings(inproc, 2).bind
    connect = Config(kv_events_config='{"enable_kv_cache_events": true, "endpoint": "tcp://router:9"}').kv_events
    assert not publisher_settings(connect, 0).bind
    off = Config(kv_events_config='{"enable_kv_cache_events": false}').kv_events
    assert publisher_settings(off, 0).endpoint is None
    ipc = Config(kv_events_config='{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/e"}').kv_events
    with pytest.raises(ConfigError, match="kv-events-config"):
        publisher_settings(ipc, 1)


def test_pod_ip_comes_from_the_environment() -> None:
    assert pod_ip({"POD_IP": "10.1.2.3"}) == "10.1.2.3"
    assert pod_ip({}) == "127.0.0.1"


async def test_a_single_rank_serves_on_its_port() -> None:
    """``--data-parallel-rank``: one rank, on ``--port`` as given, not a group of ranks."""
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve, Config(port=0, data_parallel_rank=1, data_parallel_size=2))
        assert not isinstance(handle, DataParallelHandle)
        nursery.cancel_scope.cancel()
