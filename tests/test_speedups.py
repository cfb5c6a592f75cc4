"""The compiled twins (``llmsim._speedups``) against the pure-Python path, whole.

Each twin has its own differential tests beside its layer's (tests/engine,
tests/api, tests/protocol/native); here a whole paced load runs through the
simulator twice, once with the compiled twins installed (this process) and once
with ``LLMSIM_PURE=1`` (a subprocess), and every byte either sends must be the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.token_path import run_once
from llmsim import speedups

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(speedups.NATIVE is None, reason="llmsim._speedups is not built (no C compiler?)")

#: (protocol, streams, connections, tokens per request, requests)
LOADS = [("h2", 40, 2, 12, 80), ("h2", 10, 1, 30, 20), ("h1", 20, 20, 8, 40)]


@pytest.fixture(scope="module")
def pure_runs() -> dict[tuple[str, int, int, int, int], dict[str, Any]]:
    """Every load of :data:`LOADS` on the pure path, all in one subprocess (its start-up,
    importing the simulator, takes longer than a load)."""
    code = (
        "import json, sys; from benchmarks.token_path import run_once; "
        "print(json.dumps([run_once(*load, digest=True) for load in json.loads(sys.argv[1])]))"
    )
    env = {**os.environ, speedups.PURE_ENVIRONMENT_VARIABLE: "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(LOADS)], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return dict(zip(LOADS, results, strict=True))


def test_the_pure_switch_turns_the_twins_off() -> None:
    code = "from llmsim import speedups; print(speedups.NATIVE is None)"
    for value, off in (("1", "True"), ("0", "False")):
        env = {**os.environ, speedups.PURE_ENVIRONMENT_VARIABLE: value}
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == off


@pytest.mark.parametrize("load", LOADS, ids=lambda load: "-".join(map(str, load)))
def test_a_paced_load_sends_the_same_bytes_as_the_pure_path(
    load: tuple[str, int, int, int, int], pure_runs: dict[tuple[str, int, int, int, int], dict[str, Any]]
) -> None:
    native = run_once(*load, digest=True)
    pure = pure_runs[load]
    _, _, _, tokens, requests = load
    assert native["requests"] == pure["requests"] == requests
    assert native["tokens"] == pure["tokens"] == tokens * requests
    assert (native["bytes"], native["digest"]) == (pure["bytes"], pure["digest"])
