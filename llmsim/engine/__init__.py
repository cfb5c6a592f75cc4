"""The simulation core: sans-I/O, clock-injected, no HTTP or JSON.

The API layer builds a :class:`Job` (prompt ids, the planned output from
:class:`TextGenerator`, a :class:`JobSink`), submits it to the :class:`Engine`, and the
server's step loop drives ``engine.step(now)``; the engine decides *when* each planned
token is handed to the sink.
"""

from __future__ import annotations

from llmsim.engine.errors import QUEUE_FULL_MESSAGE, QueueFullError
from llmsim.engine.job import FinishReason, Job, JobSink, JobState
from llmsim.engine.latency import LatencyModel
from llmsim.engine.scheduler import MAX_TOKENS_PER_STEP, Engine, EngineStatistics
from llmsim.engine.text import GeneratedText, TextGenerator
from llmsim.engine.tokenizer import ChatTurn, HFTokenizer, SimTokenizer, Tokenizer, load_tokenizer, render_chat

__all__ = [
    "QUEUE_FULL_MESSAGE",
    "QueueFullError",
    "FinishReason",
    "Job",
    "JobSink",
    "JobState",
    "LatencyModel",
    "MAX_TOKENS_PER_STEP",
    "Engine",
    "EngineStatistics",
    "GeneratedText",
    "TextGenerator",
    "ChatTurn",
    "HFTokenizer",
    "SimTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "render_chat",
]
