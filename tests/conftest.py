"""Shared fixtures: every end-to-end test can run against both server backends."""

from __future__ import annotations

import shutil

import pytest

BACKENDS = ("native", "hypercorn")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The server backend under test: llmsim's own handlers, or the ASGI app under hypercorn."""
    return request.param


def require_tool(name: str) -> str:
    """The path of a command-line tool, or skip the test when it is not installed."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make test installs it with apt-get when run as root)")
    return path
