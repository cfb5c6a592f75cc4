"""The simulator behind every server backend: engine, API and the engine driver task."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio

from llmsim.api import basic, chat, completions, messages, responses
from llmsim.api.context import ApiContext
from llmsim.api.router import Api, Router
from llmsim.config import Config
from llmsim.engine.scheduler import Engine
from llmsim.model.text import TextGenerator
from llmsim.model.tokenizer import load_tokenizer

__all__ = ["STEP_QUANTUM", "Simulator", "build_router"]

#: The engine task's step grid (seconds; the engine rounds it to divide the inter-token
#: latency).  Every token is handed out at the first grid time at or after its
#: deadline: at most this late, half of it on average, and with a grid that divides
#: the ITL every token of a job is late by the same amount, so ITLs stay exact.
#: Measured in docs/performance.md ("Engine steps at scale").
STEP_QUANTUM = 0.002


def _nothing() -> None:
    pass


def build_router() -> Router:
    """Every endpoint llmsim serves."""
    router = Router()
    basic.register(router)
    chat.register(router)
    completions.register(router)
    responses.register(router)
    messages.register(router)
    return router


class Simulator:
    """One simulated vLLM server: what ``serve()`` runs behind its listeners.

    ``app`` answers requests (both the native handlers and the ASGI adapter call it);
    ``run_engine`` is the single task that drives every job of the engine.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.engine = Engine(config)
        tokenizer = load_tokenizer(config.tokenizer)
        self.ctx = ApiContext(
            config=config,
            engine=self.engine,
            tokenizer=tokenizer,
            text=TextGenerator(config, tokenizer),
            clock=trio.current_time,
            wall_clock=time.time,
            started_at=trio.current_time(),
        )
        self.app = Api(self.ctx, build_router())

    async def run_engine(
        self, *, hold_writes: Callable[[], None] = _nothing, release_writes: Callable[[], None] = _nothing
    ) -> None:
        """Sleep until the engine's next step time (or a wake-up), then step it.  Forever.

        Steps are coalesced onto a grid of about :data:`STEP_QUANTUM` (see
        :meth:`Engine.set_step_quantum`), so one step serves every job due within it.
        ``hold_writes`` and ``release_writes`` bracket every step: the native server
        sends what a step wrote once it is over, connection by connection, from this
        task (see ``llmsim.protocol.native.connection.WriteCoalescer``).
        """
        engine = self.engine
        wakeup = trio.Event()

        def wake() -> None:
            wakeup.set()

        engine.set_wakeup(wake)
        engine.set_step_quantum(STEP_QUANTUM)
        while True:
            wakeup = trio.Event()
            deadline = engine.next_deadline()
            now = trio.current_time()
            if deadline <= now:
                hold_writes()
                try:
                    engine.step(now)
                finally:
                    release_writes()
                await trio.lowlevel.checkpoint()
                continue
            if math.isinf(deadline):
                await wakeup.wait()
            else:
                with trio.move_on_at(deadline):
                    await wakeup.wait()
