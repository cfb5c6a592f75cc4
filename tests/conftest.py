"""Shared fixtures (every end-to-end test can run against both server backends), the
Hypothesis profiles, a per-test timeout that trio tests survive, and a frozen heap (so
that a full garbage collection walks only what the current test module made).

Hypothesis profiles: ``quick`` (the default, what ``make test`` runs) and ``thorough``
(``HYPOTHESIS_PROFILE=thorough make test``).  The profile alone decides how many examples a
property test tries (and its timeout grows with them).  Neither has a deadline: a slow
example on a busy machine is not a failure, a hung test is, and the timeout below catches that.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import threading
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import pytest
import pytest_timeout
import trio
from hypothesis import settings

BACKENDS = ("native", "hypercorn")

QUICK_EXAMPLES = 30
settings.register_profile("quick", max_examples=QUICK_EXAMPLES, deadline=None)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The server backend under test: llmsim's own handlers, or the ASGI app under hypercorn."""
    return request.param


@pytest.fixture
def settled_heap() -> Iterator[None]:
    """For a test that holds real-clock latencies to bounds: the heap the whole session
    has built (about half a million objects by the end-to-end tests) is collected and
    frozen first, so that no full collection over it stops the server in the middle.
    Such a pass took up to 0.5 s here and landed in whichever test allocated at that
    moment (a server's own process collects rarely: ``llmsim.cli.SERVER_GC_THRESHOLDS``).
    (Never unfrozen: the session freezes its heap after each module anyway, see below.)"""
    freeze_heap()
    yield


# --- the garbage collector ------------------------------------------------------------------
# The session's heap (test modules, the libraries they import, pytest's items: about 370,000
# objects after collection, more as the run goes on) is frozen after collection and again after
# each test module.  A full collection (the automatic ones, and the explicit ones of the leak
# tests) then walks what the current module made, not the whole session: a pass over the whole
# heap took 0.3-0.5 s here, several times in some tests.  Only live objects are frozen (a
# collection comes first); a cycle they form later is never collected (memory, for this run only).


def freeze_heap() -> None:
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    freeze_heap()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the test and its teardown: module-scoped fixtures are gone before the next module
    if nextitem is None or nextitem.path != item.path:
        freeze_heap()


def require_tool(name: str) -> str:
    """The path of a command-line tool, or skip the test when it is not installed."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make test installs it with apt-get when run as root)")
    return path


# --- timeouts -------------------------------------------------------------------------------
# pytest-timeout (``timeout`` in pyproject.toml) stops a test with SIGALRM, whose handler raises
# wherever the main thread happens to be: inside trio's run loop, that leaves trio unusable
# for every later test.  So a trio test's whole run (fixtures included) is cancelled instead,
# from a wall-clock timer (a test's mock clock may race ahead) at the same limit, and fails;
# SIGALRM stays as a backstop a little later, for code that blocks without a checkpoint.
# (Hypothesis trio tests and tests with their own timeout marker keep plain pytest-timeout.)
# A property test's limit is scaled by the profile's examples over the quick profile's.

BACKSTOP_AFTER = 10.0


@pytest.hookimpl(trylast=True)  # after pytest-trio has marked the async tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return
    limit = pytest_timeout.get_env_settings(config).timeout
    if not limit:
        return
    examples_scale = max(1.0, settings.default.max_examples / QUICK_EXAMPLES)
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        item_limit = limit * examples_scale if hasattr(getattr(item, "obj", None), "hypothesis") else limit
        if item.get_closest_marker("trio") is not None:
            item.add_marker(pytest.mark.trio(run=partial(run_cancelled_after, item_limit)), append=False)
            item.add_marker(pytest.mark.timeout(item_limit + BACKSTOP_AFTER))
        elif item_limit != limit:
            item.add_marker(pytest.mark.timeout(item_limit))


def run_cancelled_after(limit: float, async_fn: Callable[[], Awaitable[None]], **run_options: Any) -> None:
    """``trio.run(async_fn)``, cancelled and failed when it takes longer than ``limit`` seconds."""
    scope = trio.CancelScope()
    waiting: list[str] = []

    def cancel(main_task: trio.lowlevel.Task) -> None:
        waiting.extend(_where_tasks_wait(main_task))
        scope.cancel()

    def cancel_soon(token: trio.lowlevel.TrioToken, main_task: trio.lowlevel.Task) -> None:  # the timer's thread
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(cancel, main_task)

    async def limited() -> None:
        timer = threading.Timer(limit, cancel_soon, (trio.lowlevel.current_trio_token(), trio.lowlevel.current_task()))
        timer.start()
        try:
            with scope:
                await async_fn()
        finally:
            timer.cancel()

    trio.run(limited, **run_options)
    if scope.cancelled_caught:
        where = "\n".join(waiting)
        pytest.fail(f"Timeout (>{limit:g}s): trio cancelled the test, which was waiting at\n{where}", pytrace=False)


def _where_tasks_wait(task: trio.lowlevel.Task) -> list[str]:
    """Every task under ``task`` (fixtures, the test, their children) and where it waits: its
    innermost frame outside trio."""
    lines = []
    for child in [child for nursery in task.child_nurseries for child in nursery.child_tasks]:
        frames = [f"{frame.f_code.co_filename}:{line}" for frame, line in child.iter_await_frames()]
        outside_trio = [frame for frame in frames if not frame.startswith(TRIO_DIRECTORY)]
        lines.append(f"  {child.name}: {(outside_trio or frames or ['?'])[-1]}")
        lines.extend(_where_tasks_wait(child))
    return lines


TRIO_DIRECTORY = os.path.dirname(trio.__file__) + os.sep
