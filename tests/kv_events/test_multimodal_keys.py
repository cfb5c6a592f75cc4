"""The keys published for a prompt with an image are the ones a router computes from
the request's render (token ids and ``features``): llm-d-router's chained keys with, per
block, the mm hashes of the items whose placeholders overlap it (``prefixHashes``,
``extra_keys.go``), computed here by the test's own reference code."""

from __future__ import annotations

import trio
import trio.testing

from llmsim.app import Simulator
from llmsim.config import Config
from tests.api.fakes import post
from tests.engine.test_kv_cache import reference_keys
from tests.kv_events.zmq_client import Subscriber, decode, ipc, replay, short_directory

BLOCK = 8
CHAT = {
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture of the old harbour at dawn, with the boats?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/harbour.png"}},
                {"type": "text", "text": "And in this one, taken at noon from the lighthouse?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/noon.png"}},
                {"type": "text", "text": "Compare the two of them, please, in a few words."},
            ],
        }
    ],
    "max_tokens": 1,
}


def _extras(features: dict[str, dict[str, list[object]]], num_tokens: int) -> list[list[str] | None]:
    """Per full block, the hashes of the items overlapping it, by placeholder offset."""
    items = sorted(
        (placeholder["offset"], placeholder["length"], digest)  # type: ignore[index]
        for modality, hashes in features["mm_hashes"].items()
        for digest, placeholder in zip(hashes, features["mm_placeholders"][modality], strict=True)
    )
    extras: list[list[str] | None] = []
    for start in range(0, num_tokens - BLOCK + 1, BLOCK):
        overlapping = [str(d) for offset, length, d in items if offset < start + BLOCK and offset + length > start]
        extras.append(overlapping or None)
    return extras


async def test_published_keys_of_a_multimodal_prompt_equal_the_routers() -> None:
    with short_directory() as directory:
        subscriber = Subscriber(ipc(directory, "events"))
        config = Config(
            port=0,
            model="base-model",
            enable_kvcache=True,
            kv_cache_size=64,
            block_size=BLOCK,
            event_batch_size=1,  # each event goes out as the pool is flushed
            zmq_endpoint=subscriber.endpoint,
            kv_events_replay_endpoint=ipc(directory, "replay"),
        )
        try:
            async with trio.open_nursery() as nursery:
                sim = Simulator(config)
                nursery.start_soon(sim.run_engine)
                rendered = (await post(sim, "/v1/chat/completions/render", CHAT)).json()
                response = await post(sim, "/v1/chat/completions", CHAT)
                assert response.status == 200, response.body
                assert sim.kv_events is not None
                await trio.testing.wait_all_tasks_blocked()  # the publisher has opened its sockets
                sim.kv_events.flush()
                assert sim.kv_events.pending == 0 and sim.kv_events.last_seq >= 1
                batches = [decode(frames) for frames in (await replay(ipc(directory, "replay"), 0))[:-1]]
                nursery.cancel_scope.cancel()
        finally:
            subscriber.close()
    stored = [list(event[1]) for batch in batches for event in batch.events if event[0] == "BlockStored"]
    token_ids = rendered["token_ids"]
    extras = _extras(rendered["features"], len(token_ids))
    assert sum(extra is not None for extra in extras) >= 2  # both images are in full blocks
    expected = reference_keys("", "base-model", token_ids, BLOCK, extras)
    assert [key for keys in stored for key in keys] == expected
    assert expected != reference_keys("", "base-model", token_ids, BLOCK)
