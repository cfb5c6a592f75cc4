"""Faults for a share of all requests (``--fault``, ``--fault-rate``, ``/admin/config``),
and every injected fault counted on ``/metrics`` and logged."""

from __future__ import annotations

import logging

import httpx
import pytest

from llmsim.config import Config
from llmsim.options import ConfigError
from tests.protocol.native.faultwire import completion, simulator


def plain_http_client(port: int) -> httpx.AsyncClient:
    """A client of the simulator on ``port``: plain HTTP, so it need not load the CA bundle
    (0.1 s a client)."""
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", verify=False)


async def outcomes(port: int, count: int, headers: dict[str, str] | None = None) -> list[str]:
    """For ``count`` streaming requests in turn: "ok", or the name of what httpx raised."""
    results = []
    headers = {"content-type": "application/json", **(headers or {})}
    async with plain_http_client(port) as client:
        for _ in range(count):
            try:
                async with client.stream("POST", "/v1/completions", content=completion(3), headers=headers) as r:
                    async for _line in r.aiter_lines():
                        pass
                results.append("ok")
            except httpx.HTTPError as exc:
                results.append(type(exc).__name__)
    return results


async def metrics_text(port: int) -> str:
    async with plain_http_client(port) as client:
        return (await client.get("/metrics")).text


def injected(text: str, fault: str) -> float:
    prefix = f'llmsim:injected_faults_total{{fault="{fault}"}} '
    line = next(line for line in text.splitlines() if line.startswith(prefix))
    return float(line.removeprefix(prefix))


async def test_fault_rate_one_faults_every_v1_request_but_not_the_others() -> None:
    async with simulator(fault="close-after=1", fault_rate=1.0) as server:
        port = server.handle.port
        assert await outcomes(port, 2) == ["RemoteProtocolError"] * 2
        text = await metrics_text(port)  # not /v1/: never faulted
    assert injected(text, "close-after") == 2


async def test_a_requests_own_header_wins_over_fault() -> None:
    async with simulator(fault="close-after=1", fault_rate=1.0) as server:
        results = await outcomes(server.handle.port, 1, {"x-llmsim-fault": "frame-size=100"})
    assert results == ["ok"]


async def test_the_share_is_reproducible_under_a_seed() -> None:
    runs = []
    for _ in range(2):
        async with simulator(fault="rst-after=1", fault_rate=0.5, seed=7) as server:
            runs.append(await outcomes(server.handle.port, 12))
    assert runs[0] == runs[1]
    assert 0 < runs[0].count("ok") < 12


async def test_without_fault_rate_nothing_is_injected() -> None:
    async with simulator(fault="rst-after=0") as server:
        assert await outcomes(server.handle.port, 2) == ["ok", "ok"]


def test_a_bad_fault_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"fault.*unknown or malformed fault 'nope=1'"):
        Config(fault="nope=1")
    with pytest.raises(ConfigError, match=r"fault-rate.*0\.\.1"):
        Config(fault_rate=1.5)


async def test_admin_config_changes_the_global_faults_live() -> None:
    async with simulator() as server:
        port = server.handle.port
        async with plain_http_client(port) as client:
            answer = await client.post("/admin/config", json={"fault": "close-after=0", "fault-rate": 1})
            assert answer.status_code == 200, answer.text
            assert (answer.json()["fault"], answer.json()["fault-rate"]) == ("close-after=0", 1)
            refused = await client.post("/admin/config", json={"fault": "close-after"})
        assert refused.status_code == 400 and "close-after" in refused.text
        assert await outcomes(port, 1) == ["RemoteProtocolError"]


async def test_metrics_count_each_fault_once_per_response_and_the_log_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmsim.protocol")
    async with simulator() as server:
        port = server.handle.port
        before = await metrics_text(port)
        await outcomes(port, 2, {"x-llmsim-fault": "frame-size=5; stall=1:0"})
        after = await metrics_text(port)
    assert injected(before, "rst-after") == injected(before, "frame-size") == 0  # every fault, from the start
    assert injected(after, "frame-size") == injected(after, "stall") == 2 and injected(after, "rst-after") == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("injected fault")]
    assert "injected fault stall on POST /v1/completions (HTTP/1.1): 0 ms after event 1" in lines
    assert sum(line.startswith("injected fault frame-size on POST /v1/completions") for line in lines) == 2
