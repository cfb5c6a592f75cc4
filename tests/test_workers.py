"""``--workers`` without a real server: the option, the metric sums, the snapshot files,
the answer headers, and the supervisor giving up on workers that cannot start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import attrs
import httpx
import pytest

from llmsim.api.metrics.collector import EngineReading
from llmsim.api.metrics.shared import WorkerReading, combine
from llmsim.config import Config, ConfigError
from llmsim.engine.metrics import EngineMetrics
from llmsim.engine.statistics import EngineStatistics
from llmsim.testing import open_simulator
from llmsim.workers.headers import WORKER_HEADER, answer_headers
from llmsim.workers.snapshots import SnapshotDir
from llmsim.workers.supervisor import MAX_START_FAILURES, Supervisor, reserve_port, worker_count


def _statistics(running: int, finished: int, lateness: float = 0.0) -> EngineStatistics:
    return EngineStatistics(
        running=running,
        waiting=1,
        submitted=running + 1 + finished,
        finished=finished,
        cancelled=0,
        rejected=0,
        generated_tokens=10 * finished,
        prompt_tokens=3 * finished,
        steps=finished,
        late_steps=0,
        max_lateness=lateness,
    )


def _reading(finished: int, running: int = 1, usage: float = 0.5, live: bool = True) -> WorkerReading:
    metrics = EngineMetrics()
    metrics.request_success["stop"] = finished
    for _ in range(finished):
        metrics.time_to_first_token.observe(0.01)
    return WorkerReading(_statistics(running, finished, lateness=finished / 1000), metrics.snapshot(), usage, live)


def test_workers_option() -> None:
    assert Config().server.workers == 1
    assert Config(workers=4).server.workers == 4
    with pytest.raises(ConfigError, match="workers"):
        Config(workers=-1)
    assert worker_count(3) == 3
    assert worker_count(0) == len(os.sched_getaffinity(0))


def test_combine_sums_counters_over_every_worker_and_gauges_over_live_ones() -> None:
    own = _reading(finished=2, running=1, usage=0.2)
    mine = EngineReading(statistics=own.statistics, metrics=own.metrics, kv_cache_usage=own.kv_cache_usage)
    peers = [_reading(finished=3, running=2, usage=0.4), _reading(finished=5, running=7, usage=0.9, live=False)]
    total = combine(mine, peers)
    assert total.metrics.request_success["stop"] == 10
    assert total.metrics.histograms["time_to_first_token_seconds"].count == 10
    assert total.metrics.histograms["time_to_first_token_seconds"].sum == pytest.approx(0.1)
    assert total.statistics.finished == 10 and total.statistics.generated_tokens == 100
    assert total.statistics.running == 3  # the dead worker's gauge is gone
    assert total.statistics.waiting == 2
    assert total.statistics.max_lateness == pytest.approx(0.005)
    assert total.kv_cache_usage == pytest.approx(0.3)  # mean of the live pools
    assert combine(mine, []) is mine


def test_snapshot_files_round_trip_and_retire(tmp_path: Path) -> None:
    shared = SnapshotDir(tmp_path)
    shared.publish(0, 0, _reading(finished=1))
    shared.publish(1, 0, _reading(finished=2))
    shared.publish(2, 0, _reading(finished=4))
    shared.publish(1, 1, _reading(finished=100))  # --data-parallel-size rank 1: a server of its own
    assert sorted(r.metrics.request_success["stop"] for r in shared.peers(exclude=0)) == [2, 4]
    assert [r.metrics.request_success["stop"] for r in shared.peers(exclude=0, rank=1)] == [100]
    shared.retire(1, generation=0)
    shared.publish(1, 0, _reading(finished=0))  # the restarted worker starts from nothing
    peers = shared.peers(exclude=0)
    assert sorted((r.metrics.request_success["stop"], r.live) for r in peers) == [(0, True), (2, False), (4, True)]
    assert _reading(finished=0).statistics in [r.statistics for r in peers]
    assert [(r.live, r.metrics.request_success["stop"]) for r in shared.peers(exclude=0, rank=1)] == [(False, 100)]
    shared.retire(5, generation=1)  # never published: nothing to keep
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "retired-1-0.r0.json",
        "retired-1-0.r1.json",
        "worker-0.r0.json",
        "worker-1.r0.json",
        "worker-2.r0.json",
    ]


def test_an_unreadable_snapshot_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "worker-1.r0.json").write_text("{not json")
    assert SnapshotDir(tmp_path).peers(exclude=0) == []
    assert "cannot read the worker metrics" in caplog.text


def test_answer_headers() -> None:
    assert answer_headers({}, 8000) == ()
    assert answer_headers({"POD_NAME": "sim-0", "POD_NAMESPACE": "ns"}, 8000, worker=1) == (
        (b"x-inference-pod", b"sim-0"),
        (b"x-inference-port", b"8000"),
        (b"x-inference-namespace", b"ns"),
        (WORKER_HEADER, b"1"),
    )


async def test_pod_headers_on_every_response(monkeypatch: pytest.MonkeyPatch) -> None:
    """llm-d-inference-sim's ``addResponseHeaders`` (``pkg/communication/http.go:209-217``)."""
    monkeypatch.setenv("POD_NAME", "sim-abc")
    monkeypatch.setenv("POD_NAMESPACE", "team")
    body = {"prompt": "hi", "max_tokens": 3, "stream": True}
    async with open_simulator() as server, httpx.AsyncClient(base_url=server.url) as client:
        models = await client.get("/v1/models")
        async with client.stream("POST", "/v1/completions", json=body) as stream:
            chunks = [line async for line in stream.aiter_lines() if line.startswith("data: ")]
    for response in (models, stream):
        assert response.headers["x-inference-pod"] == "sim-abc"
        assert response.headers["x-inference-namespace"] == "team"
        assert response.headers["x-inference-port"] == "0"  # the configured port, as llm-d's
    assert chunks[-1] == "data: [DONE]"


def test_the_reserved_port_is_shared_only_with_reuse_port() -> None:
    import socket

    reservation = reserve_port("127.0.0.1", 0)
    port = reservation.getsockname()[1]
    with reservation, reserve_port("127.0.0.1", port), socket.socket() as plain:
        plain.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        plain.bind(("127.0.0.1", port))  # nobody listens yet: SO_REUSEADDR may share
        plain.listen()
        with pytest.raises(OSError):
            reserve_port("127.0.0.1", port)  # a listener without SO_REUSEPORT holds it now


@pytest.mark.parametrize(("exit_status", "expected", "starts"), [(1, 1, MAX_START_FAILURES), (2, 2, 1)])
async def test_the_supervisor_gives_up_on_workers_that_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], exit_status: int, expected: int, starts: int
) -> None:
    """Workers that die before they serve: a configuration error (2) stops at once,
    anything else after MAX_START_FAILURES tries (with pauses between)."""
    log = tmp_path / "starts"
    command = (sys.executable, "-c", f"open({str(log)!r}, 'a').write('x'); raise SystemExit({exit_status})")
    supervisor = Supervisor(Config(port=0), 2, tmp_path, command=command)
    assert await supervisor.run() == expected
    err = capsys.readouterr().err
    assert f"failed to start {starts} time(s) (status {exit_status}); stopping" in err
    assert "restarts)" in err
    assert len(log.read_text()) >= starts


async def test_a_worker_that_serves_and_dies_is_restarted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker that got as far as serving and then exited is started again; the
    supervisor stops once the (fake) workers fail before serving."""
    counter = tmp_path / "count"
    script = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) if p.exists() else 0; "
        "p.write_text('x' * (n + 1)); sys.stdin.buffer.read(1)\n"
        "if n == 0: print('ready http://x', flush=True); raise SystemExit(0)\n"
        "raise SystemExit(1)"
    )
    supervisor = Supervisor(Config(port=0), 1, tmp_path, command=(sys.executable, "-c", script, str(counter)))
    assert await supervisor.run() == 1
    err = capsys.readouterr().err
    assert "worker 0 exited with status 0; starting it again" in err
    assert supervisor.restarts == MAX_START_FAILURES
    assert attrs.has(Supervisor)
