"""Stored responses of /v1/responses (``store``, ``previous_response_id``, GET).

Bounded and in memory: the least recently used response goes when the store is full.
A stored response keeps the exact bytes of the response object (what GET returns) and
its conversation as chat turns — the history a continuation is prompted with (input
plus output, without ``instructions``, which OpenAI does not carry over).

State owned by the simulator: each :class:`~llmsim.app.Simulator` creates one store
with its :class:`~llmsim.api.context.ApiContext`, and handlers reach it as
``ctx.response_store``; two simulators in one process share nothing.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from llmsim.api.errors import ApiError
from llmsim.model.tokenizer import ChatTurn

__all__ = ["DEFAULT_CAPACITY", "ResponseStore", "StoredResponse", "not_found"]

DEFAULT_CAPACITY = 10_000


@attrs.frozen
class StoredResponse:
    response_id: str
    body: bytes  # the response object, as returned
    history: tuple[ChatTurn, ...]  # input and output turns of the whole chain
    has_tool_output: bool  # a function_call_output occurred in the chain: tools stay off


class ResponseStore:
    """An LRU map of response id -> :class:`StoredResponse`."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    def put(self, entry: StoredResponse) -> None:
        entries = self._entries
        entries[entry.response_id] = entry
        entries.move_to_end(entry.response_id)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def require(self, response_id: str) -> StoredResponse:
        """The entry, or vLLM's 404."""
        entry = self.get(response_id)
        if entry is None:
            raise not_found(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None


def not_found(response_id: str) -> ApiError:
    return ApiError(
        404, f"Response with id '{response_id}' not found.", param="response_id", error_type="invalid_request_error"
    )
