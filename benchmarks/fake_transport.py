"""A connection without a socket, for the in-process drivers (``token_path``,
``h2_intake``, ``h1_cost``): the :class:`~llmsim.protocol.native.base.Transport` a
protocol handler runs on, with what it spawns and its wake-ups handed to the driver."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings

__all__ = ["FakeTransport", "Spawn"]

#: What the driver does with a handler task: ``spawn(fn, args)``.
Spawn = Callable[[Callable[..., Awaitable[Any]], tuple[Any, ...]], None]


def _nothing() -> None:
    pass


@attrs.define(eq=False)
class FakeTransport:
    """Spawned handler tasks go to ``spawn_task``, ``wake_writer`` calls ``wake``; the
    handler's output is whatever the driver takes with ``outgoing()``."""

    app: Any
    spawn_task: Spawn
    wake: Callable[[], None] = _nothing
    settings: ProtocolSettings = attrs.field(factory=ProtocolSettings)
    tracker: ConnectionTracker = attrs.field(factory=ConnectionTracker)
    scheme: str = "http"
    shutting_down: bool = False
    congested: bool = False

    def wake_writer(self) -> None:
        self.wake()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.spawn_task(fn, args)

    def set_read_deadline(self, deadline: float) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def switch_to(self, handler: object) -> None:
        raise AssertionError("no protocol switch in a driver")

    def close_abruptly(self, mode: str) -> None:
        pass
