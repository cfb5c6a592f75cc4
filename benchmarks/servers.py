"""Servers under test as subprocesses on 127.0.0.1, and what they cost while measured.

Each server gets a free port (bind port 0, read it, close), is polled until it answers a
one-token streaming chat request, and is stopped with SIGTERM (then SIGKILL).  A
background thread samples its CPU time, runnable time and RSS every 50 ms, so that a
scenario can ask what the server spent during exactly the measured window.
"""

from __future__ import annotations

import bisect
import http.client
import math
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import psutil

from benchmarks.loadgen.records import chat_body
from benchmarks.loadgen.runner import runnable_seconds

__all__ = ["BASELINE", "MODEL", "RunningServer", "ServerSpec", "free_port", "llmsim", "running"]

MODEL = "bench-model"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
SAMPLE_INTERVAL = 0.05
#: A server using less than this share of a core for IDLE_SETTLE seconds is idle.
IDLE_SHARE = 0.05
IDLE_SETTLE = 0.5


@attrs.frozen
class ServerSpec:
    """A server command line; ``{port}`` in it is replaced by the chosen port."""

    name: str
    argv: tuple[str, ...]

    def command(self, port: int) -> list[str]:
        return [arg.replace("{port}", str(port)) for arg in self.argv]


def llmsim(name: str, *flags: str) -> ServerSpec:
    """``python -m llmsim serve`` on the benchmark model, quick to stop, plus ``flags``."""
    base = (sys.executable, "-m", "llmsim", "serve", "--port", "{port}", "--model", MODEL)
    return ServerSpec(name, (*base, "--shutdown-grace-period", "0", *flags))


BASELINE = ServerSpec("asgi-baseline", (sys.executable, "-m", "benchmarks.baselines.asgi_sse", "--port", "{port}"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@attrs.frozen
class Sample:
    at: float
    cpu: float
    runnable: float
    rss: int


@attrs.define(eq=False)
class RunningServer:
    """A started server: its port, process and usage samples."""

    spec: ServerSpec
    port: int
    process: subprocess.Popen[bytes]
    samples: list[Sample] = attrs.field(factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sample(self) -> Sample:
        """Usage right now (CPU of all threads; runnable time of the main thread)."""
        process = psutil.Process(self.process.pid)
        times = process.cpu_times()
        return Sample(
            time.perf_counter(),
            times.user + times.system,
            runnable_seconds(self.process.pid),
            process.memory_info().rss,
        )

    def usage_between(self, begin: float, end: float) -> tuple[float, float, int]:
        """CPU seconds, runnable seconds and peak RSS between two perf_counter times."""
        if not self.samples or self.samples[0].at > begin or self.samples[-1].at < end:
            return math.nan, math.nan, 0
        times = [s.at for s in self.samples]
        cpu = self._interpolate(times, end, "cpu") - self._interpolate(times, begin, "cpu")
        runnable = self._interpolate(times, end, "runnable") - self._interpolate(times, begin, "runnable")
        inside = [s.rss for s in self.samples if begin <= s.at <= end]
        return cpu, runnable, max(inside) if inside else self.rss_at(end)

    def wait_idle(self, timeout: float) -> float:
        """Wait until the server's CPU use drops below :data:`IDLE_SHARE` of a core for
        :data:`IDLE_SETTLE` seconds; return how long that took (``timeout`` at most).

        A load ends by dropping its connections mid-stream; a server that keeps working
        for clients that are gone would otherwise steal the CPU of the next measurement.
        """
        started = time.perf_counter()
        quiet_since = started
        last = self.sample()
        while time.perf_counter() - started < timeout:
            time.sleep(SAMPLE_INTERVAL)
            now = self.sample()
            if (now.cpu - last.cpu) / (now.at - last.at) > IDLE_SHARE:
                quiet_since = now.at
            elif now.at - quiet_since >= IDLE_SETTLE:
                return quiet_since - started
            last = now
        return timeout

    def rss_at(self, at: float) -> int:
        """RSS of the last sample taken at or before ``at``."""
        index = bisect.bisect_right([s.at for s in self.samples], at) - 1
        return self.samples[max(index, 0)].rss

    def _interpolate(self, times: list[float], at: float, field: str) -> float:
        index = min(max(bisect.bisect_left(times, at), 1), len(times) - 1)
        before, after = self.samples[index - 1], self.samples[index]
        low: float = getattr(before, field)
        high: float = getattr(after, field)
        span = after.at - before.at
        return low if span <= 0 else low + (high - low) * (at - before.at) / span


@contextmanager
def running(
    spec: ServerSpec, log_dir: Path, ready: Callable[[RunningServer], None] | None = None
) -> Iterator[RunningServer]:
    """Start ``spec``, wait until it serves (``ready``, by default one streamed chat
    completion), sample it in the background, stop it after."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{spec.name}.log", "wb") as log:
        process = subprocess.Popen(spec.command(port), stdout=log, stderr=subprocess.STDOUT)
        server = RunningServer(spec, port, process)
        stop = threading.Event()
        sampler = threading.Thread(target=_sample_until, args=(server, stop), daemon=True)
        try:
            (ready or _wait_ready)(server)
            sampler.start()
            yield server
        finally:
            stop.set()
            if sampler.is_alive():
                sampler.join()
            _stop(process)


def _sample_until(server: RunningServer, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            server.samples.append(server.sample())
        except psutil.Error:
            return
        stop.wait(SAMPLE_INTERVAL)


def _wait_ready(server: RunningServer) -> None:
    """Poll with a one-token streaming chat request until it returns 200."""
    deadline = time.monotonic() + READY_TIMEOUT
    last_error = "no attempt"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.spec.name} exited with status {server.process.returncode} before it was ready")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            connection.request(
                "POST", "/v1/chat/completions", chat_body(MODEL, 1), {"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            body = response.read()
            connection.close()
            if response.status == 200 and b"[DONE]" in body:
                return
            last_error = f"HTTP {response.status}: {body[:200]!r}"
        except OSError as exc:
            last_error = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{server.spec.name} not ready after {READY_TIMEOUT:.0f} s: {last_error}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
