"""h2's objects with slots (llmsim/protocol/native/h2_objects.py): every stream a server
connection opens is one, whichever path opened it, with the very fields h2's own would
have, and h2's code reads and writes those fields through the slots."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from h2.stream import H2Stream, StreamState

from llmsim.protocol.native import h2_receive
from llmsim.protocol.native.h2_fastpath import ServerConnection, server_connection
from llmsim.protocol.native.h2_inbound import open_request
from llmsim.protocol.native.h2_objects import ConnectionMachine, RequestStream, StreamMachine, request_stream
from tests.protocol.helpers import h2_fields

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/v1/completions"), (b":authority", b"t")]
SLOTTED = ("max_outbound_frame_size", "outbound_flow_control_window", "state_machine", "stream_id")


def client() -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    return conn


def assert_slotted(stream: object) -> None:
    assert type(stream) is RequestStream and type(stream.state_machine) is StreamMachine
    assert not set(SLOTTED) & set(vars(stream))  # in the slots, not in the __dict__
    assert "state" not in vars(stream.state_machine)


def test_streams_opened_by_h2_and_by_open_request_are_slotted_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head the connection has not seen in these bytes goes through h2's own pipeline
    (``_begin_new_stream``), the same bytes again through ``open_request``.  (The
    client's HPACK encoder indexes the second head: the third has its bytes.)"""
    opened: list[int] = []

    def counted(conn: h2.connection.H2Connection, stream: RequestStream, *args: Any) -> list[h2.events.Event]:
        opened.append(stream.stream_id)
        return open_request(conn, stream, *args)

    monkeypatch.setattr(h2_receive, "open_request", counted)
    peer, server = client(), server_connection(100, 65536, None)
    assert type(server.state_machine) is ConnectionMachine and "state" not in vars(server.state_machine)
    for sid, extra in ((1, []), (3, []), (5, []), (7, [(b"x-request-id", b"7")])):
        peer.send_headers(sid, REQUEST + extra, end_stream=True)
        events = server.receive_data(peer.data_to_send())
        assert [type(event) for event in events][-2:] == [h2.events.RequestReceived, h2.events.StreamEnded]
        assert_slotted(server.streams[sid])
        assert server.streams[sid].state_machine.state is StreamState.HALF_CLOSED_REMOTE
    assert opened == [5]  # (1, 3 and 7 by h2's _begin_new_stream)


def test_an_upgrade_opens_a_slotted_stream_1() -> None:
    peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = server_connection(100, 65536, peer.initiate_upgrade_connection())
    assert isinstance(server, ServerConnection)
    assert_slotted(server.streams[1])


def test_h2_updates_the_slotted_windows_and_state_as_its_own() -> None:
    """WINDOW_UPDATE and SETTINGS_INITIAL_WINDOW_SIZE (h2 adds to the window attributes)
    and a RST_STREAM (h2's state machine) land in the slots."""
    peer, server = client(), server_connection(100, 65536, None)
    peer.send_headers(1, REQUEST, end_stream=True)
    server.receive_data(peer.data_to_send())
    stream = server.streams[1]
    peer.increment_flow_control_window(1000, stream_id=1)
    peer.increment_flow_control_window(2000)
    server.receive_data(peer.data_to_send())
    assert (stream.outbound_flow_control_window, server.outbound_flow_control_window) == (66535, 67535)
    peer.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    server.receive_data(peer.data_to_send())
    assert stream.outbound_flow_control_window == 1100
    peer.reset_stream(1)
    server.receive_data(peer.data_to_send())
    assert stream.state_machine.state is StreamState.CLOSED


def test_request_stream_copies_every_field() -> None:
    peer, reference = client(), h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    reference.initiate_connection()
    peer.send_headers(1, REQUEST)
    reference.receive_data(peer.data_to_send())
    original = reference.streams[1]
    assert type(original) is H2Stream
    copy = request_stream(original)
    assert_slotted(copy)
    fields, expected = h2_fields(copy), h2_fields(original)
    assert h2_fields(fields.pop("state_machine")) == h2_fields(expected.pop("state_machine"))
    assert fields == expected
