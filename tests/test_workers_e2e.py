"""``llmsim serve --workers 2`` as a real process: both workers answer, ``/metrics`` is the
whole server's, SIGTERM drains both, a killed worker is replaced, start-up errors end it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from llmsim.workers.snapshots import SNAPSHOT_INTERVAL

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
FAST = ("--time-to-first-token", "1ms", "--inter-token-latency", "1ms")
_WORKER_LINE = re.compile(rb"llmsim: worker (\d+) \(pid (\d+)\) serving on")


@attrs.define(eq=False)
class ServerProcess:
    """The supervisor process and everything it (and its workers) wrote on stderr."""

    process: trio.Process
    stderr: bytes = b""
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _eof: trio.Event = attrs.field(factory=trio.Event)

    async def read_stderr(self) -> None:
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.receive_some():
            self.stderr += chunk
            self._changed.set()
            self._changed = trio.Event()
        self._eof.set()
        self._changed.set()

    async def wait_for(self, pattern: bytes, count: int = 1) -> list[re.Match[bytes]]:
        """The first ``count`` matches of ``pattern`` in stderr, once there are that many
        (stderr ending first is a failure)."""
        while len(matches := list(re.finditer(pattern, self.stderr))) < count:
            assert not self._eof.is_set(), f"no {pattern!r} in: {self.text}"
            await self._changed.wait()
        return matches[:count]

    @property
    def text(self) -> str:
        return self.stderr.decode(errors="replace")

    async def workers(self) -> dict[int, int]:
        """Worker index -> pid, of the latest process of each worker."""
        await self.wait_for(rb"llmsim serving ")
        return {int(m[1]): int(m[2]) for m in _WORKER_LINE.finditer(self.stderr)}

    async def url(self) -> str:
        (match,) = await self.wait_for(rb"llmsim serving \S+ on (\S+) \(HTTP/1\.1 \+ HTTP/2, 2 workers\)")
        return match[1].decode()

    async def exit_status(self) -> int:
        """The exit status, once the process exited and its stderr is read to the end."""
        with trio.fail_after(40):
            status = await self.process.wait()
            await self._eof.wait()
        return status


@asynccontextmanager
async def llmsim_workers(*argv: str) -> AsyncIterator[ServerProcess]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "llmsim", "serve", "--port", "0", "--workers", "2", "--disable-log-stats", *argv],
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
        cwd=ROOT,
    )
    server = ServerProcess(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.read_stderr)
            with trio.fail_after(60):
                await server.wait_for(rb"llmsim serving |llmsim: .*(stopping|configuration)")
            yield server
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with trio.fail_after(40):
                await process.wait()
    finally:
        if process.returncode is None:
            process.kill()  # the workers see end of file on stdin and stop too
            await process.wait()


def _new_connections(url: str, **options: Any) -> httpx.AsyncClient:
    """One client that opens a new connection for every request (it keeps none alive), so
    that the kernel picks a worker for each: one client for many requests, since building
    a client (its TLS context) costs more than a request here."""
    return httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_keepalive_connections=0), **options)


async def _completion(client: httpx.AsyncClient, max_tokens: int = 3) -> str:
    """One completion on a new connection (so the kernel picks a worker): who answered."""
    body = {"prompt": "hi", "max_tokens": max_tokens, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    return response.headers["x-llmsim-worker"]


def _total(metrics: str, family: str) -> float:
    return sum(float(m[1]) for m in re.finditer(rf"^vllm:{family}(?:{{[^}}]*}})? (\S+)$", metrics, re.M))


async def test_both_workers_answer_metrics_are_the_sum_and_a_killed_worker_is_replaced() -> None:
    """One server for two checks in turn (starting three processes is most of this file's
    time): both workers answer and /metrics sums them; then worker 0 is killed, started
    again on its own, and both answer again; SIGTERM then ends the server with status 0."""
    async with llmsim_workers(*FAST) as server, _new_connections(await server.url()) as client:
        await _assert_metrics_are_the_sum(client)
        before = await server.workers()
        os.kill(before[0], signal.SIGKILL)
        with trio.fail_after(60):
            await server.wait_for(rb"llmsim: worker 0 exited with status -9; starting it again")
            await server.wait_for(rb"llmsim: worker 0 \(pid \d+\) serving on", count=2)
        after = await server.workers()
        assert after[0] != before[0] and after[1] == before[1]
        seen: set[str] = set()
        with trio.fail_after(60):
            for _ in range(40):  # until both answered
                seen.add(await _completion(client))
                if len(seen) == 2:
                    break
        assert seen == {"0", "1"}
        server.process.send_signal(signal.SIGTERM)
        assert await server.exit_status() == 0
    assert "(exit statuses [0, 0], 1 restarts)" in server.text


async def _assert_metrics_are_the_sum(client: httpx.AsyncClient) -> None:
    """At least 10 completions, both workers among them: /metrics (from either worker)
    counts every one."""
    answered: dict[str, int] = {}
    with trio.fail_after(60):
        while len(answered) < 2 or sum(answered.values()) < 10:
            worker = await _completion(client)
            answered[worker] = answered.get(worker, 0) + 1
            assert sum(answered.values()) < 200, answered
    sent = sum(answered.values())
    assert set(answered) == {"0", "1"}
    with trio.fail_after(10):  # the other worker's numbers are at most SNAPSHOT_INTERVAL old
        while True:
            metrics = (await client.get("/metrics")).text
            if _total(metrics, "request_success_total") == sent:
                break
            await trio.sleep(SNAPSHOT_INTERVAL / 5)
    assert _total(metrics, "generation_tokens_total") == 3 * sent
    assert _total(metrics, "e2e_request_latency_seconds_count") == sent
    assert _total(metrics, "num_requests_running") == 0


async def test_sigterm_drains_the_streams_of_both_workers() -> None:
    body = {"prompt": "hi", "max_tokens": 60, "ignore_eos": True, "stream": True}  # 3 s each
    async with (
        llmsim_workers("--inter-token-latency", "50ms", "--shutdown-grace-period", "30s") as server,
        _new_connections(await server.url(), timeout=30) as client,
        AsyncExitStack() as streams,
    ):
        in_flight: list[tuple[str, httpx.Response]] = []
        with trio.fail_after(60):
            while {worker for worker, _ in in_flight} != {"0", "1"}:  # each stream on its own connection
                response = await streams.enter_async_context(client.stream("POST", "/v1/completions", json=body))
                in_flight.append((response.headers["x-llmsim-worker"], response))
                assert len(in_flight) < 40
        server.process.send_signal(signal.SIGTERM)
        await server.wait_for(rb"llmsim: shutting down 2 workers")
        for _, response in in_flight:
            events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            assert len(events) == 61  # every token, then [DONE]
        assert await server.exit_status() == 0
    assert "llmsim: 2 workers stopped (exit statuses [0, 0], 0 restarts)" in server.text
    assert "Traceback" not in server.text


async def test_a_second_signal_stops_every_worker_at_once() -> None:
    body = {"prompt": "hi", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    async with (
        llmsim_workers("--inter-token-latency", "100ms", "--shutdown-grace-period", "1m") as server,
        httpx.AsyncClient(base_url=await server.url(), timeout=30) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        await response.aiter_bytes().__anext__()  # in flight: the graceful shutdown would wait for it
        server.process.send_signal(signal.SIGTERM)
        await server.wait_for(rb"llmsim: shutting down 2 workers")
        server.process.send_signal(signal.SIGINT)
        assert await server.exit_status() == 128 + signal.SIGINT
    assert "llmsim: stopped at once by a second signal" in server.text
    assert "Traceback" not in server.text


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (("--tokenizer", "/nonexistent/tokenizer.json"), 2, "invalid configuration: tokenizer"),
        (("--server", "hypercorn"), 2, "--workers needs --server native"),
    ],
)
async def test_start_up_errors_end_the_server(argv: tuple[str, ...], status: int, message: str) -> None:
    async with llmsim_workers(*argv) as server:
        assert await server.exit_status() == status
    assert message in server.text
    assert "Traceback" not in server.text
