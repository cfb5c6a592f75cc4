"""Which error wins when a request breaks several rules: vLLM 0.33.0's order, status and
bytes.  Each case posts a body with one earlier error, then the same body with a later
one added: the answer must be the earlier error's, byte for byte.

vLLM's order on /v1/chat/completions and /v1/completions:

1. pydantic reads the body (FastAPI): type errors, model validators such as
   ``stream_options`` without ``stream`` (chat_completion/protocol.py:858-868), field
   bounds such as ``seed`` (:253);
2. ``_check_model`` — an unknown model is a 404
   (chat_completion/serving.py:278-281, completion/serving.py:107-109);
3. ``_preflight`` — the admission check, a 503 (serving.py:283, completion/serving.py:111;
   generate/base/serving.py:169-181);
4. the renderer: ``suffix`` (renderers/online_renderer.py:614-664), then the prompt against
   the context window (renderers/params.py:270-283);
5. ``to_sampling_params`` with the clamped cap — ``SamplingParams._verify_args``, in its own
   order (sampling_params.py:634-767): temperature, top_p, n, min_tokens...
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from trio.testing import MockClock

from tests.api.fakes import post, running

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = ("/v1/chat/completions", {"messages": MESSAGES})
COMPLETIONS = ("/v1/completions", {"prompt": "hi"})
ENDPOINTS = [CHAT, COMPLETIONS]

#: Sampling values ``SamplingParams`` refuses (each a 400 on its own).
BAD_SAMPLING = [
    {"temperature": -1},
    {"top_p": 0},
    {"top_k": -2},
    {"presence_penalty": 3},
    {"n": 0},
    {"temperature": 0, "n": 2},
    {"min_tokens": -1},
    {"min_tokens": 100000},
    {"stop": [""]},
    {"max_tokens": 0},
]


async def answers(path: str, bodies: list[dict[str, Any]], **config: Any) -> list[tuple[int, bytes]]:
    async with running(**config) as sim:
        # Python's json, which writes integers beyond 64 bits as they are
        results = [await post(sim, path, json.dumps(body).encode()) for body in bodies]
        assert sim.engine.statistics().submitted == 0
    return [(response.status, response.body) for response in results]


async def assert_earlier_wins(path: str, earlier: dict[str, Any], later: dict[str, Any], **config: Any) -> int:
    alone, both = await answers(path, [earlier, {**earlier, **later}], **config)
    assert both == alone
    return alone[0]


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize("bad", BAD_SAMPLING)
async def test_an_unknown_model_is_a_404_whatever_the_sampling_values(
    path: str, base: dict[str, Any], bad: dict[str, Any], autojump_clock: MockClock
) -> None:
    """``_check_model`` runs before ``to_sampling_params``: ``temperature: -1`` with an
    unknown model is vLLM's 404, not the temperature's 400."""
    assert await assert_earlier_wins(path, {**base, "model": "nope"}, bad) == 404


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize("bad", [{"temperature": -1}, {"top_p": 1.5}, {"min_tokens": -1}])
async def test_the_admission_check_comes_before_the_sampling_values(
    path: str, base: dict[str, Any], bad: dict[str, Any], autojump_clock: MockClock
) -> None:
    """``_preflight`` (a 503 over --max-num-queued-reqs) runs before ``to_sampling_params``."""
    earlier = {**base, "n": 5}
    assert await assert_earlier_wins(path, earlier, bad, max_num_queued_reqs=4) == 503


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize(
    "earlier",
    [
        {"max_tokens": 100},  # the output cap alone exceeds the window (renderers/params.py:270-283)
        {"long": True},  # the prompt alone exceeds it
    ],
)
@pytest.mark.parametrize("bad", [{"temperature": -1}, {"n": 0}, {"min_tokens": 50}])
async def test_the_prompt_checks_come_before_the_sampling_values(
    path: str, base: dict[str, Any], earlier: dict[str, Any], bad: dict[str, Any], autojump_clock: MockClock
) -> None:
    if "long" in earlier:
        long = (
            {"messages": [{"role": "user", "content": "word " * 80}]} if path == CHAT[0] else {"prompt": "word " * 80}
        )
        earlier = long
    else:
        earlier = {**base, **earlier}
    assert await assert_earlier_wins(path, earlier, bad, max_model_len=40) == 400


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize(
    "earlier",
    [
        {"temperature": "hot"},  # a type error (FastAPI's RequestValidationError)
        {"stream_options": {"include_usage": True}},  # a model validator: no `stream`
        {"seed": 2**64},  # a field bound
    ],
)
async def test_what_pydantic_refuses_comes_before_the_model_check(
    path: str, base: dict[str, Any], earlier: dict[str, Any], autojump_clock: MockClock
) -> None:
    assert await assert_earlier_wins(path, {**base, **earlier}, {"model": "nope"}) == 400


@pytest.mark.parametrize(
    ("earlier", "later", "status"),
    [
        ({"model": "nope"}, {"suffix": "x"}, 404),  # the renderer refuses suffix after the model check
        ({"suffix": "x"}, {"temperature": -1}, 400),  # ...and before the sampling params
        ({"suffix": "x"}, {"max_tokens": 100}, 400),  # ...first thing in the renderer
    ],
)
async def test_suffix_is_refused_by_the_renderer(
    earlier: dict[str, Any], later: dict[str, Any], status: int, autojump_clock: MockClock
) -> None:
    path, base = COMPLETIONS
    assert await assert_earlier_wins(path, {**base, **earlier}, later, max_model_len=40) == status


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ({"temperature": -1}, {"min_tokens": 100000}),  # sampling_params.py:663-705
        ({"top_p": 0}, {"min_tokens": -1}),
        ({"min_p": 2}, {"max_tokens": 0}),  # sampling_params.py:690-696
        ({"max_tokens": 0}, {"stop": [""]}),  # :691-739
    ],
)
async def test_sampling_values_are_checked_in_verify_args_order(
    path: str, base: dict[str, Any], earlier: dict[str, Any], later: dict[str, Any], autojump_clock: MockClock
) -> None:
    assert await assert_earlier_wins(path, {**base, **earlier}, later) == 400
