"""The simulator behind every server backend: engine, API and the engine driver task."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Awaitable, Callable

import trio

from llmsim.admin import LiveConfig
from llmsim.api import admin, basic, chat, completions, embeddings, messages, metrics, responses, tokenize
from llmsim.api import generate as generate_api
from llmsim.api import render as render_api
from llmsim.api.admin import SleepState
from llmsim.api.context import ApiContext
from llmsim.api.grpc import routes as grpc_api
from llmsim.api.http import Application
from llmsim.api.lora import routes as lora_api
from llmsim.api.query import routes as query_api
from llmsim.api.responses.store import ResponseStore
from llmsim.api.router import Api, Router
from llmsim.config import Config, ConfigError
from llmsim.engine.kv_cache import BlockPool
from llmsim.engine.metric_buckets import parse_custom_buckets
from llmsim.engine.metrics import EngineMetrics
from llmsim.engine.scheduler import Engine
from llmsim.kv_events import KvEventsPublisher, pod_ip, publisher_settings
from llmsim.model.text import TextGenerator
from llmsim.model.tokenizer import Tokenizer, load_tokenizer
from llmsim.step_timer import StepTimer
from llmsim.workers.headers import answer_headers, with_headers

__all__ = ["STEP_QUANTUM", "Simulator", "build_engine", "build_router"]

#: The engine task's step grid (seconds; the engine rounds it to divide the inter-token
#: latency).  Every token is handed out at the grid time nearest its deadline: at most
#: half of this early or late, on time on average, and with a grid that divides the ITL
#: every token of a job is off by the same amount, so ITLs stay exact.  Measured in
#: docs/performance.md ("Engine steps at scale", "Low-load bias").
STEP_QUANTUM = 0.002


def _nothing() -> None:
    pass


def build_engine(config: Config, kv_cache: BlockPool | None = None) -> Engine:
    """The engine ``config`` asks for; ``--seed`` seeds its latency jitter.  ``kv_cache``:
    the block pool it uses, by default the one ``config`` asks for."""
    return Engine(
        config.engine,
        config.latency,
        rng=random.Random(config.model.seed),
        metrics=EngineMetrics(config.model.max_model_len, _custom_buckets(config)),
        kv_cache=kv_cache if kv_cache is not None else _kv_cache(config),
    )


def _kv_cache(config: Config) -> BlockPool | None:
    """With ``--enable-kvcache`` (or vLLM's ``--kv-events-config`` enabling events), the
    block pool, keyed by the first served model name."""
    options = config.engine
    vllm_events = config.kv_events.vllm_config()
    if not options.enable_kvcache and not (vllm_events is not None and vllm_events.enable_kv_cache_events):
        return None
    return BlockPool(options.kv_cache_size, options.block_size, options.hash_seed, model=config.model.display_model)


def _kv_events(config: Config, pool: BlockPool | None) -> KvEventsPublisher | None:
    """The publisher of ``pool``'s events, for this process's data-parallel rank."""
    if pool is None:
        return None
    options = config.kv_events
    settings = publisher_settings(options, options.rank or 0)
    return KvEventsPublisher(settings, pool, model=config.model.name, port=config.server.port, pod_ip=pod_ip())


def _custom_buckets(config: Config) -> dict[str, tuple[float, ...]] | None:
    """``--custom-histogram-buckets``, read (the Config checked it already)."""
    text = config.control.custom_histogram_buckets
    return None if text is None else parse_custom_buckets(text)


def _tokenizer(path: str | None) -> Tokenizer:
    """The tokenizer at ``path``; one that cannot be loaded is a configuration error."""
    try:
        return load_tokenizer(path)
    except ValueError as exc:
        raise ConfigError("tokenizer", str(exc)) from None


def build_router() -> Router:
    """Every endpoint llmsim serves."""
    router = Router()
    basic.register(router)
    metrics.register(router)
    chat.register(router)
    completions.register(router)
    responses.register(router)
    messages.register(router)
    render_api.register(router)
    generate_api.register(router)
    embeddings.register(router)
    admin.register(router)
    tokenize.register(router)
    lora_api.register(router)
    query_api.register(router)
    grpc_api.register(router)
    return router


class Simulator:
    """One simulated vLLM server: what ``serve()`` runs behind its listeners.

    ``app`` answers requests (both the native handlers and the ASGI adapter call it);
    ``run_engine`` is the single task that drives every job of the engine.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.kv_cache = _kv_cache(config)
        self.engine = build_engine(config, self.kv_cache)
        # POST /admin/config swaps the Config: the engine's latency, then this and ctx.control
        self.live_config = LiveConfig(config, self.engine, self._config_changed)
        tokenizer = _tokenizer(config.model.tokenizer)
        self.ctx = ApiContext(
            model=config.model,
            tool_calls=config.tool_calls,
            startup_duration=config.server.startup_duration,
            engine=self.engine,
            tokenizer=tokenizer,
            text=TextGenerator(config.model, tokenizer),
            clock=trio.current_time,
            wall_clock=time.time,
            started_at=trio.current_time(),
            response_store=ResponseStore(),
            control=config.control,
            admin=self.live_config,
            sleep=SleepState(),
        )
        # POD_NAME / POD_NAMESPACE: llm-d's x-inference-pod / -port / -namespace headers
        headers = answer_headers(os.environ, config.server.port)
        self.app: Application = with_headers(Api(self.ctx, build_router()), headers)
        #: Tasks that live as long as the engine task (``serve()`` adds the stats line),
        #: so that whatever runs the engine runs them too, on either backend.
        self.beside_engine: list[Callable[[], Awaitable[None]]] = []
        #: The KV events publisher (with a KV cache), a task beside the engine's.
        self.kv_events = _kv_events(config, self.kv_cache)
        if self.kv_events is not None:
            self.beside_engine.append(self.kv_events.run)

    def serving(self, port: int) -> None:
        """The server is bound to ``port`` (KV event topics name it)."""
        if self.kv_events is not None:
            self.kv_events.serving_port(port)

    def _config_changed(self, config: Config) -> None:
        self.config = config
        self.ctx.control = config.control

    async def run_engine(
        self, *, hold_writes: Callable[[], None] = _nothing, release_writes: Callable[[], None] = _nothing
    ) -> None:
        """Drive the engine (:meth:`_drive_engine`), with the :attr:`beside_engine` tasks
        (the periodic stats line) beside it.  Forever."""
        async with trio.open_nursery() as nursery:
            for task in self.beside_engine:
                nursery.start_soon(task)
            await self._drive_engine(hold_writes, release_writes)

    async def _drive_engine(self, hold_writes: Callable[[], None], release_writes: Callable[[], None]) -> None:
        """Sleep until the engine's next step time (or a wake-up), then step it.  Forever.

        Steps are coalesced onto a grid of about :data:`STEP_QUANTUM` (see
        :meth:`Engine.set_step_quantum`), so one step serves every job due within it.
        The sleep ends on a :class:`~llmsim.step_timer.StepTimer` where there is one
        (trio's own deadline would wake it up to a millisecond late: the timer's module
        says why), else on a cancel scope's deadline.
        ``hold_writes`` and ``release_writes`` bracket every step: the native server
        sends what a step wrote once it is over, connection by connection, from this
        task (see ``llmsim.protocol.native.connection.WriteCoalescer``).
        """
        engine = self.engine
        engine.set_step_quantum(STEP_QUANTUM)

        def step_due() -> bool:
            """Step the engine if its next step is due; else False (the caller sleeps)."""
            now = trio.current_time()
            if engine.next_deadline() > now:
                return False
            hold_writes()
            try:
                engine.step(now)
            finally:
                release_writes()
            return True

        timer = StepTimer.open()
        if timer is None:
            await self._drive_on_deadlines(step_due)
            return
        try:
            await self._drive_on_timer(timer, step_due)
        finally:
            timer.close()

    async def _drive_on_timer(self, timer: StepTimer, step_due: Callable[[], bool]) -> None:
        """The driver's loop on a step timer: a wake-up re-arms the timer to fire at
        once, so a sleep costs no cancel scope (entering one, and above all its deadline
        expiring, was about 4 % of a paced server's CPU: one per step)."""
        engine = self.engine
        sleeping = False

        def wake() -> None:
            nonlocal sleeping
            if sleeping:
                sleeping = False  # (one re-arming per sleep is enough)
                timer.fire_now()

        engine.set_wakeup(wake)
        while True:
            if step_due() and engine.next_deadline() <= trio.current_time():
                await trio.lowlevel.checkpoint()  # due again at once: the other tasks first
                continue
            # (Right after a step, the sleep is the checkpoint: one trip through trio's
            # run loop per step, not two.)
            sleeping = True
            try:
                await timer.sleep_until(engine.next_deadline())
            finally:
                sleeping = False

    async def _drive_on_deadlines(self, step_due: Callable[[], bool]) -> None:
        """The driver's loop without a step timer (a test's MockClock, or no timerfd):
        it sleeps in a cancel scope with the next step's deadline, which a wake-up cancels."""
        engine = self.engine
        sleeping: trio.CancelScope | None = None

        def wake() -> None:
            if sleeping is not None:
                sleeping.cancel()

        engine.set_wakeup(wake)
        while True:
            if step_due():
                await trio.lowlevel.checkpoint()
                continue
            sleeping = trio.CancelScope(deadline=engine.next_deadline())
            with sleeping:
                await trio.sleep_forever()
            sleeping = None
