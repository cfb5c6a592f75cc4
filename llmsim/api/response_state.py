"""The life of one response: explicit states and the one table of allowed transitions.

Every :class:`~llmsim.api.http.ResponseStream` (the native handlers', the ASGI
adapter's, a test double) moves through this table, so ``started``, ``ended`` and
``closed`` mean the same everywhere.  A state says what the producer (the API) has
done -- nothing yet, ``start()``, ``end()`` -- and what became of the delivery:
still open, complete, or closed early because the client went away::

              START              END            COMPLETE
     IDLE ──────────▶ STREAMING ──────▶ ENDED ───────────▶ DONE
       │ CLOSE            │ CLOSE         │ CLOSE
       ▼       START      ▼       END     ▼
  CLOSED_IDLE ──────▶ CLOSED_STREAMING ──────▶ CLOSED_ENDED

Events: START, WRITE and END are the producer's calls; COMPLETE is the backend saying
the transport has taken the last byte; CLOSE is the client going away (EOF, reset,
``http.disconnect``, connection loss) or the backend aborting the response.  After a
CLOSE the producer's calls are still allowed in the same order (a producer racing the
disconnect needs no check), and what they write is dropped.  CLOSE is ignored once a
response is DONE or closed already.  Anything else is a :class:`ResponseStateError`
naming the state and the event.

``closed`` means "nothing more will be sent": the response is DONE, or it closed early.

Implementations check ``state is ResponseState.STREAMING`` on their per-write path and
consult the table (:func:`next_state`) only when that fails, so the table costs the
hot path nothing.  (Both enums are ``StrEnum``: their hash is ``str``'s, a C call,
which keeps the table lookups cheap on the per-request path.)
"""

from __future__ import annotations

import enum

__all__ = [
    "CLOSED_STATES",
    "ENDED_STATES",
    "NOT_STARTED_STATES",
    "ResponseEvent",
    "ResponseState",
    "ResponseStateError",
    "ResponseStateFlags",
    "next_state",
]


class ResponseState(enum.StrEnum):
    """Where one response is (see the module diagram)."""

    IDLE = "idle"  # start() not called yet
    STREAMING = "streaming"  # the head is decided; the body is being written
    ENDED = "ended"  # end() called; the last bytes may still wait for the transport
    DONE = "done"  # the transport has taken everything: the response is complete
    CLOSED_IDLE = "closed-idle"  # the client went away before start()
    CLOSED_STREAMING = "closed-streaming"  # ... after start(), before end()
    CLOSED_ENDED = "closed-ended"  # ... after end(), before the transport took the last byte

    @property
    def started(self) -> bool:
        """``start()`` was called."""
        return self not in NOT_STARTED_STATES

    @property
    def ended(self) -> bool:
        """``end()`` was called."""
        return self in ENDED_STATES

    @property
    def closed(self) -> bool:
        """Nothing more will be sent: the response is complete or the client is gone."""
        return self in CLOSED_STATES


class ResponseEvent(enum.StrEnum):
    """What can happen to a response."""

    START = "start"  # the producer decided the status and headers
    WRITE = "write"  # the producer appended body bytes
    END = "end"  # the producer finished the body
    COMPLETE = "complete"  # the transport took the last byte
    CLOSE = "close"  # the client went away, or the backend aborted the response


_S, _E = ResponseState, ResponseEvent
_TRANSITIONS: dict[ResponseState, dict[ResponseEvent, ResponseState]] = {
    _S.IDLE: {_E.START: _S.STREAMING, _E.CLOSE: _S.CLOSED_IDLE},
    _S.STREAMING: {_E.WRITE: _S.STREAMING, _E.END: _S.ENDED, _E.CLOSE: _S.CLOSED_STREAMING},
    _S.ENDED: {_E.COMPLETE: _S.DONE, _E.CLOSE: _S.CLOSED_ENDED},
    _S.DONE: {_E.CLOSE: _S.DONE},
    _S.CLOSED_IDLE: {_E.START: _S.CLOSED_STREAMING, _E.CLOSE: _S.CLOSED_IDLE},
    _S.CLOSED_STREAMING: {_E.WRITE: _S.CLOSED_STREAMING, _E.END: _S.CLOSED_ENDED, _E.CLOSE: _S.CLOSED_STREAMING},
    _S.CLOSED_ENDED: {_E.CLOSE: _S.CLOSED_ENDED},
}
# The states where ``started`` is False, ``ended`` and ``closed`` are True: per-request
# paths test ``state in ...`` directly (a C-level lookup, not a property call).
NOT_STARTED_STATES = frozenset({_S.IDLE, _S.CLOSED_IDLE})
ENDED_STATES = frozenset({_S.ENDED, _S.DONE, _S.CLOSED_ENDED})
CLOSED_STATES = frozenset({_S.DONE, _S.CLOSED_IDLE, _S.CLOSED_STREAMING, _S.CLOSED_ENDED})

#: Why an event is refused, by event: the hint that follows the state in the error.
_HINTS = {
    _E.START: "start() is called once",
    _E.WRITE: "write() belongs between start() and end()",
    _E.END: "end() is called once, after start()",
    _E.COMPLETE: "only an ended response can complete",
}


class ResponseStateFlags:
    """A response stream's ``closed``, ``started`` and ``ended``, read off its ``state``:
    the one spelling every implementation mixes in (it adds no slots)."""

    __slots__ = ()
    state: ResponseState

    @property
    def closed(self) -> bool:
        return self.state.closed

    @property
    def started(self) -> bool:
        return self.state.started

    @property
    def ended(self) -> bool:
        return self.state.ended


class ResponseStateError(RuntimeError):
    """A response was asked to do something its state does not allow."""

    def __init__(self, state: ResponseState, event: ResponseEvent) -> None:
        hint = _HINTS.get(event, "not in the table")
        super().__init__(f"response stream: cannot {event.value} in state {state.name}: {hint}")
        self.state = state
        self.event = event


def next_state(state: ResponseState, event: ResponseEvent) -> ResponseState:
    """The state after ``event`` in ``state``; raises :class:`ResponseStateError` if the
    table does not allow it."""
    try:
        return _TRANSITIONS[state][event]
    except KeyError:
        raise ResponseStateError(state, event) from None
