"""``GET/POST /admin/config``: llm-d-inference-sim's live configuration
(pkg/communication/http.go:1033-1068, pkg/common/config.go:702-870,
pkg/llm-d-inference-sim/context.go:120-150) on a real server, with httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
import trio
from trio.testing import MockClock

from llmsim.admin import ADMIN_KEYS, go_duration
from llmsim.config import SETTINGS, parse_duration
from llmsim.testing import open_simulator

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
FAKE = {"running-requests": 5, "waiting-requests": 2}
#: The fields tagged ``admin:"configurable"`` in llm-d's pkg/common/config.go, less the image ones.
SIMULATED_LLMD_ADMIN_KEYS = {
    "latency-calculator",
    "time-to-first-token",
    "time-to-first-token-std-dev",
    "inter-token-latency",
    "inter-token-latency-std-dev",
    "prefill-overhead",
    "prefill-time-per-token",
    "prefill-time-std-dev",
    "kv-cache-transfer-latency",
    "kv-cache-transfer-latency-std-dev",
    "kv-cache-transfer-time-per-token",
    "kv-cache-transfer-time-std-dev",
    "time-factor-under-load",
    "failure-injection-rate",
    "failure-types",
    "fake-metrics",
}


# verify=False: plain HTTP, and a verifying client loads the CA bundle first (~0.1 s each)
@asynccontextmanager
async def serving(**config: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        open_simulator(**config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30, verify=False) as client,
    ):
        yield client


async def configuration(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/admin/config")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    value: dict[str, Any] = response.json()
    return value


async def test_get_shows_every_setting_under_its_key_with_durations_as_go_writes_them() -> None:
    async with serving(
        time_to_first_token=0.1,
        inter_token_latency=0.0015,
        keep_alive_timeout=90,
        failure_types=("rate_limit",),
        fake_metrics=orjson.dumps(FAKE).decode(),
        api_key=("top-secret", "other-secret"),
    ) as client:
        response = await client.get("/admin/config")
    shown = response.json()
    assert list(shown) == sorted(setting.key for setting in SETTINGS.values())  # Go writes a map sorted
    assert (shown["time-to-first-token"], shown["inter-token-latency"]) == ("100ms", "1.5ms")
    assert (shown["keep-alive-timeout"], shown["prefill-overhead"]) == ("1m30s", "0s")
    assert shown["failure-types"] == ["rate_limit"] and shown["fake-metrics"] == FAKE
    assert shown["max-num-seqs"] == 256 and shown["time-factor-under-load"] == 1.0
    assert shown["api-key"] == ["***", "***"] and b"secret" not in response.content


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (250e-9, "250ns"),
        (1.5e-6, "1.5µs"),
        (0.1, "100ms"),
        (0.0125, "12.5ms"),
        (2.5, "2.5s"),
        (90.0, "1m30s"),
        (60.5, "1m0.5s"),
        (3600.0, "1h0m0s"),
        (5025.0, "1h23m45s"),
    ],
)
def test_durations_read_as_go_writes_them_and_back(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_the_configurable_keys_are_llm_ds_that_llmsim_simulates() -> None:
    """Plus llmsim's own: the protocol faults for a share of requests (docs/faults.md)."""
    assert SIMULATED_LLMD_ADMIN_KEYS | {"fault", "fault-rate"} == ADMIN_KEYS


async def test_post_answers_the_new_configuration_and_get_agrees() -> None:
    async with serving() as client:
        response = await client.post(
            "/admin/config",
            json={
                "time-to-first-token": "1m30s",
                "inter_token_latency": 250,
                "failure-types": "rate_limit server_error",
            },
        )
        after = await configuration(client)
    assert response.status_code == 200
    assert response.json() == after
    assert after["time-to-first-token"] == "1m30s"
    assert after["inter-token-latency"] == "250ms"  # a bare number is milliseconds, as llmsim's YAML
    assert after["failure-types"] == ["rate_limit", "server_error"]


async def test_a_latency_change_applies_to_requests_admitted_afterwards(autojump_clock: MockClock) -> None:
    async with serving() as client:

        async def elapsed() -> float:
            started = trio.current_time()
            response = await client.post("/v1/chat/completions", json=CHAT)
            assert response.status_code == 200
            return trio.current_time() - started

        before = await elapsed()
        changed = await client.post("/admin/config", json={"time-to-first-token": "2s"})
        after = await elapsed()
    assert changed.status_code == 200
    assert before < 0.1
    assert 2.0 <= after < 2.1


async def test_a_failure_injection_change_applies_to_the_next_request() -> None:
    async with serving() as client:
        before = await client.post("/v1/chat/completions", json=CHAT)
        changed = await client.post(
            "/admin/config", json={"failure-injection-rate": 100, "failure-types": ["rate_limit"]}
        )
        after = await client.post("/v1/chat/completions", json=CHAT)
    assert (before.status_code, changed.status_code, after.status_code) == (200, 200, 429)


async def test_null_leaves_a_key_as_it_is() -> None:
    async with serving(time_to_first_token=0.25) as client:
        response = await client.post("/admin/config", json={"time-to-first-token": None, "failure-injection-rate": 5})
    assert response.status_code == 200
    assert response.json()["time-to-first-token"] == "250ms" and response.json()["failure-injection-rate"] == 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"port": 1}', "field 'port' is not admin-configurable"),
        (b'{"time-to-first-token": "1s", "max-num-seqs": 2}', "field 'max-num-seqs' is not admin-configurable"),
        (b'{"image-emission-rate": 5}', "field 'image-emission-rate' is not admin-configurable"),
        (b'{"nonsense": true}', "field 'nonsense' is not admin-configurable"),
        (
            b'{"time-to-first-token": "1s", "inter-token-latency": "soon"}',
            "invalid configuration: inter-token-latency: expected a duration such as 100ms, 1.5s or a number of "
            "milliseconds, got 'soon'",
        ),
        (
            b'{"time-to-first-token": "1s", "time-to-first-token-std-dev": "1s"}',
            "invalid configuration: time-to-first-token-std-dev: must be at most 30% of time-to-first-token (1.0s), "
            "got 1.0s",
        ),
        (
            b'{"failure-injection-rate": 101}',
            "invalid configuration: failure-injection-rate: must be a percentage in 0..100, got 101",
        ),
        (
            b'{"failure-injection-rate": 2.5}',
            "invalid configuration: failure-injection-rate: expected an integer, got 2.5",
        ),
        (
            b'{"failure-types": ["rate_limit", "flood"]}',
            "invalid configuration: failure-types: unknown failure type 'flood'; choose from rate_limit, "
            "invalid_api_key, context_length, server_error, invalid_request, model_not_found",
        ),
        (b'{"latency-calculator": "fast"}', "invalid configuration: latency-calculator: must be one of"),
        (
            b'{"fake-metrics": {"running-requests": 1}}',
            "the simulator is reporting real metrics; fake metrics cannot be updated",
        ),
        (b'{"time-to-first-token": "1s"', "failed to unmarshal payload: "),
        (b'["time-to-first-token"]', "failed to unmarshal payload: expected a JSON object"),
        (b"", "failed to unmarshal payload: "),
    ],
)
async def test_a_bad_update_is_a_400_and_changes_nothing(body: bytes, message: str) -> None:
    async with serving() as client:
        before = await configuration(client)
        response = await client.post("/admin/config", content=body)
        after = await configuration(client)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith(message), error["message"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", None, 400)
    assert after == before


async def test_fake_metrics_change_key_by_key_when_the_server_started_with_them() -> None:
    async with serving(fake_metrics=orjson.dumps(FAKE).decode()) as client:
        response = await client.post(
            "/admin/config", json={"fake-metrics": {"waiting-requests": 7, "kv-cache-usage": "ramp:0:1:10s"}}
        )
        refused = await client.post("/admin/config", json={"fake-metrics": [1]})
        after = await configuration(client)
    assert response.status_code == 200
    assert after["fake-metrics"] == {"running-requests": 5, "waiting-requests": 7, "kv-cache-usage": "ramp:0:1:10s"}
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "invalid configuration: fake-metrics: expected a JSON object, got list"


async def test_two_concurrent_updates_with_a_request_in_flight_lose_nothing() -> None:
    """Each update is checked and applied in one synchronous call: the second starts from
    the first's result, never from a stale copy, and the stream in flight runs to its end."""
    first = {"time-to-first-token": "40ms", "time-to-first-token-std-dev": "10ms", "failure-types": ["rate_limit"]}
    second = {"inter-token-latency": "3ms", "failure-injection-rate": 0, "time-factor-under-load": 2}
    stream = {**CHAT, "max_tokens": 50, "stream": True, "ignore_eos": True}
    answers: list[dict[str, Any]] = []
    async with serving(inter_token_latency=0.002) as client:
        async with client.stream("POST", "/v1/chat/completions", json=stream) as in_flight:
            lines = in_flight.aiter_lines()
            assert (await lines.__anext__()).startswith("data: ")  # the stream is under way

            async def update(values: dict[str, Any]) -> None:
                response = await client.post("/admin/config", json=values)
                assert response.status_code == 200
                answers.append(response.json())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(update, first)
                nursery.start_soon(update, second)
            rest = [line async for line in lines if line.startswith("data: ")]
        after = await configuration(client)
    expected = {
        "time-to-first-token": "40ms",
        "time-to-first-token-std-dev": "10ms",
        "failure-types": ["rate_limit"],
        "inter-token-latency": "3ms",
        "failure-injection-rate": 0,
        "time-factor-under-load": 2.0,
    }
    assert {key: after[key] for key in expected} == expected
    # the update applied second answers both changes; the first, only its own
    [earlier] = [answer for answer in answers if answer != after]
    assert after in answers
    assert [all(earlier[key] == after[key] for key in update) for update in (first, second)].count(True) == 1
    assert rest[-1] == "data: [DONE]"
    assert orjson.loads(rest[-2][len("data: ") :])["choices"][0]["finish_reason"] == "length"
