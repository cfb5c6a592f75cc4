"""The response state table (``llmsim.api.response_state``): what it allows, and the
error for everything else."""

from __future__ import annotations

import itertools

import pytest

from llmsim.api.http import ResponseEvent, ResponseState, ResponseStateError, next_state

S, E = ResponseState, ResponseEvent
ALLOWED = {
    (S.IDLE, E.START): S.STREAMING,
    (S.IDLE, E.CLOSE): S.CLOSED_IDLE,
    (S.STREAMING, E.WRITE): S.STREAMING,
    (S.STREAMING, E.END): S.ENDED,
    (S.STREAMING, E.CLOSE): S.CLOSED_STREAMING,
    (S.ENDED, E.COMPLETE): S.DONE,
    (S.ENDED, E.CLOSE): S.CLOSED_ENDED,
    (S.DONE, E.CLOSE): S.DONE,
    (S.CLOSED_IDLE, E.START): S.CLOSED_STREAMING,
    (S.CLOSED_IDLE, E.CLOSE): S.CLOSED_IDLE,
    (S.CLOSED_STREAMING, E.WRITE): S.CLOSED_STREAMING,
    (S.CLOSED_STREAMING, E.END): S.CLOSED_ENDED,
    (S.CLOSED_STREAMING, E.CLOSE): S.CLOSED_STREAMING,
    (S.CLOSED_ENDED, E.CLOSE): S.CLOSED_ENDED,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_every_state_and_event_is_allowed_or_refused_by_name(state: ResponseState, event: ResponseEvent) -> None:
    if (state, event) in ALLOWED:
        assert next_state(state, event) is ALLOWED[state, event]
        return
    with pytest.raises(ResponseStateError) as raised:
        next_state(state, event)
    assert isinstance(raised.value, RuntimeError)
    assert (raised.value.state, raised.value.event) == (state, event)
    assert f"cannot {event.value} in state {state.name}" in str(raised.value)


def test_the_flags_of_each_state() -> None:
    flags = {state: (state.started, state.ended, state.closed) for state in S}
    assert flags == {
        S.IDLE: (False, False, False),
        S.STREAMING: (True, False, False),
        S.ENDED: (True, True, False),
        S.DONE: (True, True, True),
        S.CLOSED_IDLE: (False, False, True),
        S.CLOSED_STREAMING: (True, False, True),
        S.CLOSED_ENDED: (True, True, True),
    }


def test_a_closed_state_stays_closed_and_flags_never_go_back() -> None:
    for (state, _), after in ALLOWED.items():
        assert after.started >= state.started and after.ended >= state.ended and after.closed >= state.closed
