"""The same loads expressed for h2load (nghttp2) and wrk, and an h2load cross-check.

Both tools are C: they bound from above what a client can take from our servers, and a
reader can rerun them without trusting our load generator.  h2load reports only
request rates and per-connection first-byte times (no per-request TTFT, no ITL), so it
checks throughput only.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import attrs

from benchmarks.loadgen.records import chat_body

__all__ = ["H2loadResult", "h2load_command", "parse_h2load", "request_files", "run_h2load", "shell", "wrk_command"]

_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored"
)


def request_files(directory: Path, model: str, max_tokens: int) -> tuple[Path, Path]:
    """The request body for h2load's ``-d`` and a Lua script that makes wrk POST it."""
    directory.mkdir(parents=True, exist_ok=True)
    body = chat_body(model, max_tokens)
    body_path = directory / "chat_body.json"
    body_path.write_bytes(body)
    script_path = directory / "chat_post.lua"
    script_path.write_text(
        f'wrk.method = "POST"\nwrk.body = \'{body.decode()}\'\nwrk.headers["Content-Type"] = "application/json"\n'
    )
    return body_path, script_path


def h2load_command(
    port: int, *, connections: int, streams: int, duration: float, warmup: float, body: Path, http1: bool = False
) -> list[str]:
    command = ["h2load", "-c", str(connections), "-m", str(streams), "-t", "1"]
    command += ["-D", f"{duration - warmup:g}", "--warm-up-time", f"{warmup:g}"]
    command += ["-d", str(body), "-H", "content-type: application/json"]
    if http1:
        command.append("--h1")
    return [*command, f"http://127.0.0.1:{port}/v1/chat/completions"]


def wrk_command(port: int, *, connections: int, duration: float, script: Path) -> list[str]:
    return [
        "wrk",
        "-t",
        "1",
        "-c",
        str(connections),
        "-d",
        f"{duration:g}s",
        "--latency",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}/v1/chat/completions",
    ]


def shell(command: list[str]) -> str:
    return shlex.join(command)


@attrs.frozen
class H2loadResult:
    command: str
    seconds: float
    requests_per_second: float
    succeeded: int
    failed: int
    errored: int

    def tokens_per_second(self, max_tokens: int) -> float:
        """Completed requests only: h2load cannot count a stream still running at the end."""
        done = self.succeeded + self.failed
        return self.requests_per_second * max_tokens * self.succeeded / done if done else 0.0


def run_h2load(command: list[str], timeout: float) -> H2loadResult | None:
    """Run h2load; None when it is not installed.  Raises on a run it cannot parse."""
    if shutil.which(command[0]) is None:
        return None
    output = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False).stdout
    return parse_h2load(command, output)


def parse_h2load(command: list[str], output: str) -> H2loadResult:
    """h2load's summary; raises on output it cannot parse."""
    finished, requests = _FINISHED.search(output), _REQUESTS.search(output)
    if finished is None or requests is None:
        raise RuntimeError(f"unexpected h2load output:\n{output[-2000:]}")
    seconds = float(finished.group(1)) / (1000.0 if finished.group(2) == "ms" else 1.0)
    _, _, _, succeeded, failed, errored = (int(g) for g in requests.groups())
    return H2loadResult(shell(command), seconds, float(finished.group(3)), succeeded, failed, errored)
