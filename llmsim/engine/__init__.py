"""The simulation core: when each token is due.  Sans-I/O and clock-injected.

The API layer builds a :class:`Job` (prompt ids, the output planned by
:mod:`llmsim.model`, a :class:`JobSink`) and submits it to the :class:`Engine`; the
server's step loop drives ``engine.step(now)``, and the engine decides *when* each
planned token is handed to the sink.  Scheduler, latency model, chunked prefill (and
later the KV cache and LoRA slots) live here.  Imports nothing from ``llmsim.api``,
``llmsim.protocol``, the configuration loader or the CLI.
"""

from __future__ import annotations

from llmsim.engine.errors import QueueFullError, QueueLimit
from llmsim.engine.job import Job, JobSink, JobState
from llmsim.engine.latency import LatencyModel
from llmsim.engine.scheduler import MAX_TOKENS_PER_STEP, Engine
from llmsim.engine.statistics import EngineStatistics

__all__ = [
    "MAX_TOKENS_PER_STEP",
    "Engine",
    "EngineStatistics",
    "Job",
    "JobSink",
    "JobState",
    "LatencyModel",
    "QueueFullError",
    "QueueLimit",
]
