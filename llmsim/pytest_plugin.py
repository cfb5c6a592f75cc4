"""pytest plugin: a running simulator for trio test suites (pytest-trio).

Installed with llmsim (entry point ``pytest11``).  Fixtures:

- ``llmsim_config``: the :class:`llmsim.Config` used by ``llmsim_server``; override it in
  your own conftest to change latencies, model names, etc.
- ``llmsim_server``: a :class:`llmsim.ServerHandle` of a simulator running on a free port
  for the duration of the test (``llmsim_server.url``).

``llmsim_server`` is an async fixture, which only pytest-trio can run, and pytest-trio runs
async fixtures only for tests it runs itself: tests marked ``trio``, or every async test
under ``trio_mode = true``.  So that a suite needs no configuration of its own, this plugin
marks every async test that uses ``llmsim_server`` (directly or through another fixture)
``trio``.  Nothing is imported from llmsim until a fixture runs: the plugin is loaded into
every pytest session of an environment where llmsim is installed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from llmsim.config import Config
    from llmsim.server import ServerHandle

SERVER_FIXTURE = "llmsim_server"
PYTEST_TRIO = "trio"  # pytest-trio's plugin name, and the name of its marker


@pytest.fixture
def llmsim_config() -> Config:
    from llmsim.config import Config

    return Config(port=0)


@pytest.fixture
async def llmsim_server(llmsim_config: Config) -> AsyncIterator[ServerHandle]:
    from llmsim.testing import open_simulator

    async with open_simulator(llmsim_config) as handle:
        yield handle


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``trio`` the async tests that use ``llmsim_server`` and are not marked yet (runs
    after pytest-trio's own hook, which marks every async test under ``trio_mode``)."""
    if not config.pluginmanager.hasplugin(PYTEST_TRIO):
        return  # pytest reports the unhandled async fixture; the README says to install pytest-trio
    for item in items:
        if (
            isinstance(item, pytest.Function)
            and SERVER_FIXTURE in item.fixturenames
            and item.get_closest_marker(PYTEST_TRIO) is None
            and iscoroutinefunction(_test_function(item))
        ):
            item.add_marker(pytest.mark.trio)


def _test_function(item: pytest.Function) -> object:
    """The function the test runs: for a Hypothesis test, the one inside ``@given``."""
    hypothesis = getattr(item.obj, "hypothesis", None)
    return item.obj if hypothesis is None else hypothesis.inner_test
