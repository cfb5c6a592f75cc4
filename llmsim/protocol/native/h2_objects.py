"""h2's connection and stream objects, with what the per-token write reads in slots.

h2 keeps every attribute of its connection, its streams and their state machines in
the instance ``__dict__``.  The per-token write (``Http2Stream.write``, whose compiled
twin is ``native/h2_write.c``) reads seven of them and writes two, for every token:
both state machines' ``state``, both ``outbound_flow_control_window``, the
connection's ``max_outbound_frame_size`` and the stream's ``stream_id``.  From C, a
lookup in a ``__dict__`` object is a walk of the type's MRO and a dict probe (about
200 instructions, a third of the compiled write's cost); a slot is one load.

So these subclasses declare exactly those names in ``__slots__``: a slot is a data
descriptor of the subclass, which wins over the ``__dict__`` for every read and write,
so h2's own code keeps reading and assigning ``self.state`` or
``self.outbound_flow_control_window`` as ever, and the value lives in the slot.  Nothing
else changes: the same attributes, set to the same values by the same code.  The
compiled write reads the slots by offset only on objects of these classes (it checks),
so a stream h2 made itself (an unusual request head goes through h2's own
``_begin_new_stream``) is written by the pure path, as before.
(:class:`~.h2_fastpath.ServerConnection` slots the connection's own three fields and
hands these classes to the compiled write.)
"""

from __future__ import annotations

from h2.config import H2Configuration
from h2.connection import H2ConnectionStateMachine
from h2.stream import H2Stream, H2StreamStateMachine

__all__ = ["ConnectionMachine", "RequestStream", "StreamMachine", "request_stream"]


class ConnectionMachine(H2ConnectionStateMachine):
    """h2's connection state machine, its ``state`` in a slot."""

    __slots__ = ("state",)


class StreamMachine(H2StreamStateMachine):
    """h2's stream state machine, its ``state`` in a slot."""

    __slots__ = ("state",)


class RequestStream(H2Stream):
    """h2's stream, as h2 makes it, with what a DATA frame reads in slots and a
    :class:`StreamMachine`."""

    __slots__ = ("max_outbound_frame_size", "outbound_flow_control_window", "state_machine", "stream_id")

    def __init__(
        self, stream_id: int, config: H2Configuration, inbound_window_size: int, outbound_window_size: int
    ) -> None:
        super().__init__(stream_id, config, inbound_window_size, outbound_window_size)
        self.state_machine = StreamMachine(stream_id)  # (h2's own, just made and still IDLE, replaced)


def request_stream(stream: H2Stream) -> RequestStream:
    """``stream`` as a :class:`RequestStream`: every attribute the same, its state
    machine's too.  For the streams h2 makes itself (``ServerConnection._begin_new_stream``:
    a request head not remembered as ordinary), right after it made them."""
    slotted = RequestStream.__new__(RequestStream)
    for name, value in vars(stream).items():
        setattr(slotted, name, value)  # (into a slot where the name has one)
    machine = StreamMachine.__new__(StreamMachine)
    for name, value in vars(stream.state_machine).items():
        setattr(machine, name, value)
    slotted.state_machine = machine
    return slotted
