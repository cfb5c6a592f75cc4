"""Errors the engine raises at its callers."""

from __future__ import annotations

__all__ = ["QUEUE_FULL_MESSAGE", "QueueFullError"]

QUEUE_FULL_MESSAGE = "Failed to enqueue request, waiting requests queue is full"


class QueueFullError(Exception):
    """:meth:`Engine.submit` found the waiting queue at ``max_waiting_queue_length``.

    The job is REJECTED and nothing else changed; the API answers 429 with this message
    (llm-d-inference-sim's wording).  Retry later, or raise ``max-waiting-queue-length``.
    """

    def __init__(self, message: str = QUEUE_FULL_MESSAGE) -> None:
        super().__init__(message)
