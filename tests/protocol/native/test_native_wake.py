"""The C twin of ``Connection.wake_writer`` (native/wake.c) against the pure one.

Both run on identical connections in every state the wake-up reads (dirty or not, a
coalescer held or not, none, a direct socket or not, values of other types); what
they leave behind must be the same: the dirty flag, the coalescer's queue, and
whether the writer task was unparked.
"""

from __future__ import annotations

import itertools
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from llmsim.protocol.native.connection import PURE_WAKE_WRITER, Connection, WriteCoalescer
from llmsim.speedups import NATIVE

pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built")

Wake = Callable[[Connection], None]
NATIVE_WAKE: Wake = Connection.wake_writer
TWINS = pytest.mark.parametrize("wake", [PURE_WAKE_WRITER, NATIVE_WAKE], ids=["pure", "native"])


@attrs.define
class RecordingLot:
    """Stands for the writer's ParkingLot: counts unpark_all() calls."""

    unparked: int = 0

    def unpark_all(self) -> None:
        self.unparked += 1


def connection(dirty: Any, coalescer: WriteCoalescer | None, direct: Any) -> Connection:
    made = Connection(stream=None, app=None, settings=None, tracker=None, coalescer=coalescer)  # type: ignore[arg-type]
    made._dirty = dirty
    made._direct = direct
    made._writer_lot = RecordingLot()  # type: ignore[assignment]
    return made


def outcome(wake: Wake, dirty: Any, held: Any, has_coalescer: bool, direct: Any) -> tuple[Any, ...]:
    coalescer = WriteCoalescer() if has_coalescer else None
    if coalescer is not None:
        coalescer.held = held
    made = connection(dirty, coalescer, direct)
    wake(made)
    lot = made._writer_lot
    assert isinstance(lot, RecordingLot)
    pending = [] if coalescer is None else [entry is made for entry in coalescer._pending]
    return made._dirty, pending, lot.unparked


STATES = list(
    itertools.product(
        [False, True, 0, 1, None],  # _dirty
        [False, True, 0, 1],  # coalescer.held
        [True, False],  # a coalescer at all
        [None, object(), 0],  # _direct
    )
)


@pytest.mark.parametrize(("dirty", "held", "has_coalescer", "direct"), STATES)
def test_the_twins_leave_the_same_state(dirty: Any, held: Any, has_coalescer: bool, direct: Any) -> None:
    pure = outcome(PURE_WAKE_WRITER, dirty, held, has_coalescer, direct)
    native = outcome(NATIVE_WAKE, dirty, held, has_coalescer, direct)
    assert native == pure


def test_the_native_twin_is_installed() -> None:
    assert Connection.wake_writer is not PURE_WAKE_WRITER
    assert type(Connection.__dict__["wake_writer"]).__name__ == "method_descriptor"


@TWINS
def test_a_held_wake_up_defers_the_connection_once(wake: Wake) -> None:
    coalescer = WriteCoalescer()
    coalescer.hold()
    made = connection(False, coalescer, object())
    wake(made)
    wake(made)
    assert coalescer._pending == [made] and made._dirty is True
    assert isinstance(made._writer_lot, RecordingLot) and made._writer_lot.unparked == 0


@TWINS
def test_a_defer_that_raises_propagates(wake: Wake) -> None:
    coalescer = WriteCoalescer()
    coalescer.hold()

    def refuse(_: object) -> None:
        raise RuntimeError("queue closed")

    coalescer.defer = refuse
    made = connection(False, coalescer, object())
    with pytest.raises(RuntimeError, match="queue closed"):
        wake(made)


@TWINS
def test_arguments_are_refused_as_python_refuses_them(wake: Wake) -> None:
    made = connection(False, None, None)
    with pytest.raises(TypeError):
        wake(made, 1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        wake(made, now=1)  # type: ignore[call-arg]


def test_no_reference_is_leaked() -> None:
    coalescer = WriteCoalescer()
    made = connection(False, coalescer, object())
    before = (sys.getrefcount(made), sys.getrefcount(coalescer))
    tracemalloc.start()
    try:
        for _ in range(10_000):
            coalescer.hold()
            made._dirty = False
            NATIVE_WAKE(made)
            coalescer._pending.clear()
        traced = tracemalloc.get_traced_memory()[0]
        for _ in range(10_000):
            coalescer.hold()
            made._dirty = False
            NATIVE_WAKE(made)
            coalescer._pending.clear()
        assert tracemalloc.get_traced_memory()[0] - traced < 4096
    finally:
        tracemalloc.stop()
    assert (sys.getrefcount(made), sys.getrefcount(coalescer)) == before
