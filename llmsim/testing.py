"""Helpers for test suites that embed a simulator (used by the pytest plugin too)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from llmsim.config import Config
from llmsim.server import ServerHandle, serve

__all__ = ["open_simulator"]


@asynccontextmanager
async def open_simulator(config: Config | None = None, **overrides: Any) -> AsyncIterator[ServerHandle]:
    """Run a simulator on a free port for the duration of the ``async with`` block.

    ``overrides`` are Config fields (``time_to_first_token=0.05``); ``port`` defaults to
    0 so that tests never fight over a fixed port.
    """
    if config is None:
        config = Config(**{"port": 0, **overrides})
    elif overrides:
        config = attrs.evolve(config, **overrides)
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(serve, config)
        try:
            yield handle
        finally:
            nursery.cancel_scope.cancel()
