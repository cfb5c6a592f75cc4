"""pytest plugin: a running simulator for trio test suites (pytest-trio).

Installed with llmsim (entry point ``pytest11``).  Fixtures:

- ``llmsim_config``: the :class:`llmsim.Config` used by ``llmsim_server``; override it in
  your own conftest to change latencies, model names, etc.
- ``llmsim_server``: a :class:`llmsim.ServerHandle` of a simulator running on a free port
  for the duration of the test (``llmsim_server.url``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llmsim.config import Config
from llmsim.server import ServerHandle
from llmsim.testing import open_simulator


@pytest.fixture
def llmsim_config() -> Config:
    return Config(port=0)


@pytest.fixture
async def llmsim_server(llmsim_config: Config) -> AsyncIterator[ServerHandle]:
    async with open_simulator(llmsim_config) as handle:
        yield handle
