"""Errors the engine raises at its callers."""

from __future__ import annotations

import enum

__all__ = ["QueueFullError", "QueueLimit"]


class QueueLimit(enum.Enum):
    """The two queue limits a request can hit, named by their flags.

    The engine only says which one was hit; the API decides what the client sees
    (llm-d-inference-sim's 429 for the first, vLLM's 503 for the second).
    """

    WAITING_QUEUE_LENGTH = "max-waiting-queue-length"  # llm-d-inference-sim: jobs waiting for a slot
    QUEUED_REQUESTS = "max-num-queued-reqs"  # vLLM: jobs in flight, running or waiting


class QueueFullError(Exception):
    """A request cannot be taken: ``limit`` says which queue limit it hit.

    Raised by :meth:`Engine.check_admission` (``QUEUED_REQUESTS``; nothing changed) and
    by :meth:`Engine.submit` (``WAITING_QUEUE_LENGTH``; the job is now REJECTED and
    nothing else changed).
    """

    def __init__(self, limit: QueueLimit) -> None:
        super().__init__(f"queue full: {limit.value}")
        self.limit = limit
