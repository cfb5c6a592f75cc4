"""The engine keys a job's prompt blocks by its multimodal items (``Job.kv_multimodal``):
the same token ids with another image share the blocks before the image's first block
and no block from it on, as llm-d-router's ``TokensToKVBlockKeys`` with the request's
``ComputeBlockExtraFeatures`` (llm-d-inference-sim pkg/kv-cache/kv_cache.go:111-121)."""

from __future__ import annotations

from llmsim.engine.job import JobState
from llmsim.engine.kv_cache import BlockPool
from llmsim.engine.kv_hashing import MultimodalItem
from llmsim.engine.scheduler import Engine
from llmsim.engine.testing import planned_job, run_until_idle
from llmsim.options import EngineOptions, LatencyOptions
from tests.engine.test_kv_cache import reference_keys

BLOCK = 16
PROMPT = 70  # four full blocks and a tail


def _run(engine: Engine, image: str | None, now: float) -> tuple[tuple[int, ...], int]:
    """Run one 70-token job (tokens 0..69), with ``image`` over tokens 20..27 (block 1)
    unless None: its prompt's block keys and its cached tokens."""
    job = planned_job(prompt=PROMPT, output=2)
    if image is not None:
        job.kv_multimodal = (MultimodalItem(image, 20, 8),)
    engine.submit(job, now)
    run_until_idle(engine)
    assert job.state is JobState.FINISHED and job.kv_prompt is not None
    return job.kv_prompt.hashes, job.cached_tokens


def test_another_image_changes_the_keys_from_its_block_on() -> None:
    pool = BlockPool(64, BLOCK, "", model="m")
    engine = Engine(EngineOptions(), LatencyOptions(), kv_cache=pool)
    first, first_cached = _run(engine, "sim_img_0_aaaa", 0.0)
    other, other_cached = _run(engine, "sim_img_0_bbbb", 10.0)
    same, same_cached = _run(engine, "sim_img_0_aaaa", 20.0)
    text, text_cached = _run(engine, None, 30.0)
    assert first[0] == other[0] == text[0]  # block 0 holds only text before the image
    assert not set(first[1:]) & set(other[1:])  # the chain differs from the image's block on
    assert not set(first[1:]) & set(text[1:])
    assert same == first
    assert (first_cached, other_cached, same_cached, text_cached) == (0, BLOCK, 4 * BLOCK, BLOCK)
    tokens = list(range(PROMPT))
    extras: list[list[str] | None] = [None, ["sim_img_0_aaaa"], None, None]
    assert list(first) == reference_keys("", "m", tokens, BLOCK, extras)
