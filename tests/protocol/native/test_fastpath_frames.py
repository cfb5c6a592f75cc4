"""The hand-built DATA frames (``frames`` and ``h2_fastpath``) against h2 itself.

Two server H2Connections receive the very same client bytes; one sends DATA with h2's
own ``send_data`` (the reference, in the way the handler used to: frame by frame, each
at most ``min(window, MAX_FRAME_SIZE)``), the other with ``h2_fastpath.send_data`` (the whole
window at once, split at MAX_FRAME_SIZE).  After every operation of a random sequence
(writes, flushes, WINDOW_UPDATEs, SETTINGS changes, resets, stream ends) both must have
produced byte-identical output and hold identical flow-control windows and stream
states, and a client H2Connection, which enforces its receive windows and
MAX_FRAME_SIZE, must accept every byte.
"""

from __future__ import annotations

import attrs
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h11
import pytest
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from h2.stream import StreamState
from hyperframe.frame import DataFrame, Frame
from hypothesis import given
from hypothesis import strategies as st

from llmsim.protocol.native import frames, h2_fastpath

REQUEST = [(b":method", b"POST"), (b":path", b"/v1/chat/completions"), (b":scheme", b"http"), (b":authority", b"x")]


def parse_frames(data: bytes) -> list[Frame]:
    parsed = []
    view = memoryview(data)
    while view:
        frame, length = Frame.parse_frame_header(view[:9])
        frame.parse_body(view[9 : 9 + length])
        parsed.append(frame)
        view = view[9 + length :]
    return parsed


# --- pure framing ----------------------------------------------------------------------


@given(size=st.integers(0, 70000), max_frame=st.sampled_from([16384, 16385, 20000, 65535]), end=st.booleans())
def test_data_frames_split_at_max_frame_size_with_end_stream_on_the_last(size: int, max_frame: int, end: bool) -> None:
    if size == 0 and not end:
        return  # never asked for: an empty frame without END_STREAM says nothing
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    out: list[bytes] = []
    frames.data_frames(out, 7, data, max_frame, end)
    parsed = parse_frames(b"".join(out))
    assert all(isinstance(f, DataFrame) and f.stream_id == 7 for f in parsed)
    assert b"".join(f.data for f in parsed) == data
    assert all(len(f.data) <= max_frame for f in parsed)
    assert len(parsed) == max(1, -(-size // max_frame))
    assert ["END_STREAM" in f.flags for f in parsed] == [False] * (len(parsed) - 1) + [end]
    # and byte for byte what hyperframe serializes
    expected = []
    for index, f in enumerate(parsed):
        reference = DataFrame(7, data=f.data)
        if end and index == len(parsed) - 1:
            reference.flags.add("END_STREAM")
        expected.append(reference.serialize())
    assert b"".join(out) == b"".join(expected)


def test_chunk_is_what_h11_writes() -> None:
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    server.next_event()
    server.send(h11.Response(status_code=200, headers=[(b"content-type", b"text/event-stream")], reason=b"OK"))
    assert frames.h11_sends_chunked(server)
    for data in (b"x", b"data: 1\n\n" * 300, bytes(range(256))):
        assert frames.chunk(data) == server.send(h11.Data(data=data))
    assert frames.chunk(b"") == b""  # an empty chunk would end the body


@pytest.mark.parametrize(
    ("request_head", "headers"),
    [
        (b"GET / HTTP/1.0\r\n\r\n", []),  # HTTP/1.0: the body is delimited by the close
        (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", [(b"content-length", b"5")]),
        (b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", []),
    ],
)
def test_h11_sends_chunked_only_for_chunked_bodies(request_head: bytes, headers: list) -> None:
    server = h11.Connection(h11.SERVER)
    server.receive_data(request_head)
    server.next_event()
    server.send(h11.Response(status_code=200, headers=headers, reason=b"OK"))
    assert not frames.h11_sends_chunked(server)


# --- flow control against h2 ----------------------------------------------------------


@attrs.define
class Pair:
    """A server (whose DATA is sent one way or the other) and its client."""

    fast: bool
    server: h2.connection.H2Connection = attrs.field(init=False)
    client: h2.connection.H2Connection = attrs.field(init=False)
    wire: list[bytes] = attrs.field(factory=list)  # every byte the server sent
    received: dict[int, bytes] = attrs.field(factory=dict)
    ended: set[int] = attrs.field(factory=set)

    def __attrs_post_init__(self) -> None:
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.server.initiate_connection()
        self.client.initiate_connection()
        self.to_server()
        self.to_client(self.server.data_to_send())
        self.to_server()

    def to_server(self) -> None:
        self.server.receive_data(self.client.data_to_send())
        self.to_client(self.server.data_to_send())

    def to_client(self, data: bytes) -> None:
        self.wire.append(data)
        for event in self.client.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                assert event.stream_id is not None and event.data is not None
                self.received[event.stream_id] = self.received.get(event.stream_id, b"") + event.data
            elif isinstance(event, h2.events.StreamEnded):
                assert event.stream_id is not None
                self.ended.add(event.stream_id)
        self.server.receive_data(self.client.data_to_send())  # SETTINGS ACKs, if any
        leftover = self.server.data_to_send()
        if leftover:
            self.to_client(leftover)

    def open(self, sid: int, end_request: bool) -> None:
        self.client.send_headers(sid, REQUEST, end_stream=end_request)
        self.to_server()
        self.server.send_headers(sid, [(b":status", b"200")])
        self.to_client(self.server.data_to_send())

    def send(self, sid: int, pending: bytes, end: bool) -> int:
        """Send what the windows allow of ``pending`` (END_STREAM with the last byte if
        ``end``); return how many bytes went.  A lone END_STREAM waits while the stream
        window is negative, as the handler does (RFC 9113 6.9.2)."""
        server = self.server
        if not pending and server.streams[sid].outbound_flow_control_window < 0:
            return -1
        if self.fast:
            stream = h2_fastpath.sendable_stream(server, sid)
            assert stream is not None
            window = min(server.outbound_flow_control_window, stream.outbound_flow_control_window)
            if pending and window <= 0:
                return 0
            data = pending[: max(window, 0)]
            out: list[bytes] = []
            h2_fastpath.send_data(out, server, stream, data, end and len(data) == len(pending))
            self.to_client(b"".join(out))
            return len(data)
        sent = 0
        while sent < len(pending):
            size = min(server.local_flow_control_window(sid), server.max_outbound_frame_size, len(pending) - sent)
            if size <= 0:
                break
            last = sent + size == len(pending)
            server.send_data(sid, pending[sent : sent + size], end_stream=end and last)
            sent += size
        if end and not pending:
            server.end_stream(sid)
        self.to_client(server.data_to_send())
        return sent

    def state(self) -> tuple:
        server = self.server
        streams = tuple(
            (sid, s.state_machine.state, s.outbound_flow_control_window, s.max_outbound_frame_size)
            for sid, s in sorted(server.streams.items())
        )
        return (
            server.state_machine.state,
            server.outbound_flow_control_window,
            server.max_outbound_frame_size,
            streams,
            self.received,
            self.ended,
        )


STREAMS = (1, 3, 5)
# Small and large values both, and the edges around the default MAX_FRAME_SIZE: plain
# integers would mostly be small, and never split a frame.
sizes = st.one_of(st.integers(1, 300), st.sampled_from([16383, 16384, 16385]), st.integers(10000, 45000))
windows = st.one_of(st.integers(0, 300), st.sampled_from([16383, 16384, 16385, 65535]), st.integers(10000, 70000))
operations = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(STREAMS), sizes),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("window"), st.sampled_from((0, *STREAMS)), windows.filter(bool)),
    st.tuples(st.just("initial_window"), st.just(0), windows),
    st.tuples(st.just("max_frame"), st.just(0), st.sampled_from([16384, 16385, 20000, 40000])),
    st.tuples(st.just("end"), st.sampled_from(STREAMS), st.just(0)),
    st.tuples(st.just("reset"), st.sampled_from(STREAMS), st.just(0)),
)


@given(
    ops=st.lists(operations, max_size=40),
    initial_window=windows,
    end_requests=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_fast_data_frames_match_h2_byte_for_byte(ops: list, initial_window: int, end_requests: list[bool]) -> None:
    pairs = [Pair(fast=False), Pair(fast=True)]
    for pair in pairs:
        pair.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: initial_window})
        pair.to_server()
        for sid, end_request in zip(STREAMS, end_requests, strict=True):
            pair.open(sid, end_request)
    pending = {sid: b"" for sid in STREAMS}
    written = {sid: b"" for sid in STREAMS}
    ending: set[int] = set()
    reset: set[int] = set()
    finished: set[int] = set()  # END_STREAM sent
    live = set(STREAMS)
    counter = 0
    for op, target, value in ops:
        if op == "write" and target in live and target not in ending:
            pending[target] += bytes([counter % 256]) * value
            written[target] += bytes([counter % 256]) * value
            counter += 1
        elif op == "end" and target in live:
            ending.add(target)
        elif op == "reset" and target in live:
            live.discard(target)
            reset.add(target)
            for pair in pairs:
                pair.client.reset_stream(target, ErrorCodes.CANCEL)
                pair.to_server()
                assert h2_fastpath.sendable_stream(pair.server, target) is None
        elif op == "window":
            if target and target not in live:
                continue
            for pair in pairs:
                pair.client.increment_flow_control_window(value, stream_id=target or None)
                pair.to_server()
        elif op == "initial_window":
            for pair in pairs:
                pair.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: value})
                pair.to_server()
        elif op == "max_frame":
            for pair in pairs:
                pair.client.update_settings({SettingCodes.MAX_FRAME_SIZE: value})
                pair.to_server()
        elif op == "flush":
            for sid in sorted(live):
                if not pending[sid] and sid not in ending:
                    continue
                sent = {pair.send(sid, pending[sid], sid in ending) for pair in pairs}
                assert len(sent) == 1, sent
                count = sent.pop()
                if count < 0:
                    continue  # END_STREAM waits for a positive window
                pending[sid] = pending[sid][count:]
                if sid in ending and not pending[sid]:
                    live.discard(sid)
                    finished.add(sid)
        reference, fast = pairs
        assert b"".join(fast.wire) == b"".join(reference.wire)
        assert fast.state() == reference.state()
    # what the client received is what was written, and END_STREAM came exactly with the last byte
    fast = pairs[1]
    for sid in STREAMS:
        assert written[sid].startswith(fast.received.get(sid, b""))
        assert (sid in fast.ended) == (sid in finished)
        if sid in fast.ended:
            assert fast.received.get(sid, b"") == written[sid]


def test_sendable_stream_refuses_closed_streams_and_a_closed_connection() -> None:
    pair = Pair(fast=True)
    pair.open(1, end_request=True)
    pair.open(3, end_request=False)
    assert h2_fastpath.sendable_stream(pair.server, 1) is not None  # half-closed (remote)
    assert h2_fastpath.sendable_stream(pair.server, 3) is not None  # open
    assert h2_fastpath.sendable_stream(pair.server, 5) is None  # never opened
    pair.client.reset_stream(1)
    pair.to_server()
    assert h2_fastpath.sendable_stream(pair.server, 1) is None
    with pytest.raises(h2.exceptions.StreamClosedError):
        pair.server.send_data(1, b"x")  # what the handler's fallback then raises
    stream = h2_fastpath.sendable_stream(pair.server, 3)
    assert stream is not None
    out: list[bytes] = []
    h2_fastpath.send_data(out, pair.server, stream, b"bye", True)
    assert pair.server.streams[3].state_machine.state is StreamState.HALF_CLOSED_LOCAL
    assert h2_fastpath.sendable_stream(pair.server, 3) is None
    pair.client.close_connection()
    pair.to_server()
    assert h2_fastpath.sendable_stream(pair.server, 3) is None


def test_send_data_refuses_more_than_the_window() -> None:
    pair = Pair(fast=True)
    pair.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 10})
    pair.to_server()
    pair.open(1, end_request=True)
    stream = h2_fastpath.sendable_stream(pair.server, 1)
    assert stream is not None
    with pytest.raises(AssertionError, match="flow-control window"):
        h2_fastpath.send_data([], pair.server, stream, b"x" * 11, False)
    assert stream.outbound_flow_control_window == 10  # nothing was accounted
