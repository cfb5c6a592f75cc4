"""KV events for routers: the block pool's events, batched and published over ZMQ as
vLLM and llm-d-inference-sim publish them, with a replay socket (docs/kv-cache.md).

This is wiring, beside the engine: :mod:`llmsim.engine.kv_cache` records the events
without I/O, :mod:`.wire` encodes and batches them, :mod:`.publisher` owns the sockets.
"""

from __future__ import annotations

from llmsim.kv_events.publisher import KvEventsPublisher, PublisherSettings, pod_ip, publisher_settings

__all__ = ["KvEventsPublisher", "PublisherSettings", "pod_ip", "publisher_settings"]
