"""``h2_inbound.open_request`` and ``request_data``: a stream opened by a remembered
ordinary request head is made exactly as h2 makes it, and DATA on an open stream is
received exactly as h2 receives it.

The server's connection and a stock h2 connection with the same configuration receive
the same client bytes: repeated request heads (which the server's decoder remembers, so
they take ``open_request``), with and without END_STREAM, ``content-length`` and a
PRIORITY flag, after the client has changed its window and frame size; then each
request's body, too long for its ``content-length`` or not, or beyond the flow-control
window.  Events, bytes sent, errors and every attribute of each new stream (its state
machine, windows, expected and received length) must be the same.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from h2.settings import SettingCodes, Settings
from hyperframe.frame import DataFrame

from llmsim.protocol.native import h2_fastpath, h2_receive
from llmsim.protocol.native.h2_fastpath import server_connection
from tests.protocol.helpers import h2_fields

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/v1/completions"), (b":authority", b"t")]
MAX_STREAMS, MAX_HEADERS = SettingCodes.MAX_CONCURRENT_STREAMS, SettingCodes.MAX_HEADER_LIST_SIZE
REFERENCE_CONFIG = h2_fastpath._CONFIG  # stock h2 with the server connection's own configuration


def outcome(conn: h2.connection.H2Connection, data: bytes) -> tuple:
    try:
        events = conn.receive_data(data)
    except h2.exceptions.ProtocolError as exc:
        return ("error", type(exc), str(exc)), conn.data_to_send()
    described = []
    for event in events:
        fields = dict(vars(event))
        for name in ("stream_ended", "priority_updated"):
            if fields.get(name) is not None:
                fields[name] = vars(fields[name])
        described.append((type(event), repr(fields)))  # (ChangedSetting has no __eq__)
    return described, conn.data_to_send()


def snapshot(conn: h2.connection.H2Connection, sid: int) -> tuple:
    stream = conn.streams[sid]
    own: dict[str, Any] = {k: v for k, v in h2_fields(stream).items() if k not in ("state_machine", "config")}
    own["_inbound_window_manager"] = vars(own["_inbound_window_manager"])
    return h2_fields(stream.state_machine), own, stream.config is conn.config, conn.highest_inbound_stream_id


def connections() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection, h2.connection.H2Connection]:
    """A client, the server's connection and a stock h2 one set up alike."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    ours, reference = server_connection(100, 65536, None), h2.connection.H2Connection(REFERENCE_CONFIG)
    # (server_connection's settings: a limit of 100 streams advertised, then lifted)
    reference.local_settings = Settings(client=False, initial_values={MAX_STREAMS: 100, MAX_HEADERS: 65536})
    reference.initiate_connection()
    reference.local_settings = Settings(client=False, initial_values={MAX_STREAMS: 2**31 - 1, MAX_HEADERS: 65536})
    assert ours.data_to_send() == reference.data_to_send()
    return client, ours, reference


@pytest.mark.parametrize("priority", [False, True])
@pytest.mark.parametrize("length", [None, b"0", b"3"])
@pytest.mark.parametrize("end_stream", [False, True])
def test_a_remembered_request_head_opens_its_stream_exactly_as_h2_does(
    end_stream: bool, length: bytes | None, priority: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened, bodies = [], []
    real_open, real_data = h2_receive.open_request, h2_receive.request_data
    monkeypatch.setattr(h2_receive, "open_request", lambda *args: opened.append(args[1].stream_id) or real_open(*args))
    monkeypatch.setattr(h2_receive, "request_data", lambda *args: bodies.append(args[2]) or real_data(*args))
    client, ours, reference = connections()
    head = [*REQUEST, (b"content-length", length)] if length is not None else REQUEST
    for index in range(4):
        sid = 2 * index + 1
        if index == 2:
            client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1000, SettingCodes.MAX_FRAME_SIZE: 20000})
        client.send_headers(sid, head, end_stream=end_stream, priority_weight=20 if priority else None)
        data = client.data_to_send()
        assert outcome(ours, data) == outcome(reference, data)
        assert snapshot(ours, sid) == snapshot(reference, sid)
        if not end_stream:
            client.send_data(sid, b"abc", end_stream=True)
            data = client.data_to_send()
            result = outcome(ours, data)
            assert result == outcome(reference, data)
            if result[0][0] == "error":  # (a body longer than its content-length)
                assert length == b"0"
                break
            assert snapshot(ours, sid) == snapshot(reference, sid)
    # The block is the same from the second request on; remembered once decoded, the
    # third and fourth take open_request (unless PRIORITY, which h2 handles).
    assert opened == ([] if priority or (length == b"0" and not end_stream) else [5, 7])
    assert bodies == ([] if end_stream else [b"abc"] * (1 if length == b"0" else 4))


def test_data_beyond_the_flow_control_window_is_refused_exactly_as_by_h2() -> None:
    """Four full DATA frames on one stream: the fourth overruns the 65,535-byte windows."""
    client, ours, reference = connections()
    client.send_headers(1, REQUEST)
    data = client.data_to_send()
    assert outcome(ours, data) == outcome(reference, data)
    for _ in range(4):
        data = DataFrame(1, data=b"x" * 16384).serialize()
        result = outcome(ours, data)
        assert result == outcome(reference, data)
        assert snapshot(ours, 1) == snapshot(reference, 1)
    assert result[0][:2] == ("error", h2.exceptions.FlowControlError)


def test_the_walk_forgets_the_closed_streams_h2_forgets_in_the_same_order() -> None:
    """Streams answered, reset by the client, reset by the server, and open: the server's
    walk (``open_inbound_streams``, forced) leaves the same streams and closed-stream
    memory as h2's own ``_open_streams``."""
    client, ours, _ = connections()
    reference = server_connection(100, 65536, None)
    for sid in range(1, 41, 2):
        client.send_headers(sid, REQUEST, end_stream=sid % 3 != 0)
        if sid % 7 == 0:
            client.reset_stream(sid)
    data = client.data_to_send()
    for conn in (ours, reference):
        conn.receive_data(data)
        for sid in range(1, 41, 2):
            if sid not in conn.streams or conn.streams[sid].closed:
                continue
            if sid % 5 == 0:
                conn.send_headers(sid, [(b":status", b"200")], end_stream=True)
            elif sid % 11 == 0:
                conn.reset_stream(sid)
    ours._next_walk = 0
    ours.open_inbound_streams  # noqa: B018 (the walk)
    count = h2.connection.H2Connection._open_streams(reference, 1)
    assert list(ours.streams) == list(reference.streams) and len(ours.streams) == count
    assert list(ours._closed_streams.items()) == list(reference._closed_streams.items())
    assert 0 < len(ours._closed_streams) < 20


@pytest.mark.parametrize("reset", [False, True])
def test_acknowledged_body_bytes_give_the_window_updates_h2_gives(reset: bool) -> None:
    """A 60,000-byte body acknowledged frame by frame (h2 sends WINDOW_UPDATEs for the
    connection and the stream once enough is acknowledged), on an open stream or one
    the server has reset meanwhile (no stream update then); and a stream id h2 does not
    know (its own path, and error)."""
    client, ours, reference = connections()
    client.send_headers(1, REQUEST)
    data = client.data_to_send()
    assert outcome(ours, data) == outcome(reference, data)
    sent = []
    for index in range(4):
        data = DataFrame(1, data=b"x" * 15000).serialize()
        assert outcome(ours, data) == outcome(reference, data)
        if reset and index == 2:
            for conn in (ours, reference):
                conn.reset_stream(1)
        for conn in (ours, reference):
            conn.acknowledge_received_data(15000, 1)
        sent.append(ours.data_to_send())
        assert sent[-1] == reference.data_to_send()
        assert snapshot(ours, 1) == snapshot(reference, 1)
        assert ours.inbound_flow_control_window == reference.inbound_flow_control_window
    assert any(sent)
    for conn in (ours, reference):
        with pytest.raises(h2.exceptions.NoSuchStreamError):
            conn.acknowledge_received_data(100, 99)
    assert ours.data_to_send() == reference.data_to_send()
    assert ours.inbound_flow_control_window == reference.inbound_flow_control_window
