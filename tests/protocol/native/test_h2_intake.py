"""The request intake's shortcuts through h2 (issue 16, third pass), each against h2 itself:
the stream state transitions made by hand (``SEND_HEADERS`` and ``SEND_END_STREAM``),
the flow-control count of received DATA, and the trimmed memory of closed streams; and
a handler that returns without ending its response over HTTP/2 (``run_handler``).
"""

from __future__ import annotations

import collections

import h2.config
import h2.connection
import h2.windows
import pytest
from h2.errors import ErrorCodes
from h2.stream import StreamInputs, StreamState
from h2.utilities import SizeLimitDict
from hypothesis import given
from hypothesis import strategies as st

from llmsim.protocol.native import h2_fastpath
from llmsim.protocol.native.h2_fastpath import send_data, send_response_head, sendable_stream, server_connection
from tests.protocol.helpers import H2Client, TestApp, h2_fields, open_memory_connection

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/v1/completions"), (b":authority", b"t")]


def pair(request_ended: bool) -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    """The server's connection and a stock h2 one, each with stream 1 opened by the same
    request (ended or not)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.send_headers(1, REQUEST, end_stream=request_ended)
    data = client.data_to_send()
    ours, reference = server_connection(100, 65536, None), h2.connection.H2Connection(h2_fastpath._CONFIG)
    reference.initiate_connection()
    ours.receive_data(data)
    reference.receive_data(data)
    return ours, reference


def machine_state(conn: h2.connection.H2Connection) -> dict[str, object]:
    return h2_fields(conn.streams[1].state_machine)


@given(request_ended=st.booleans(), response_ended=st.booleans())
def test_a_response_head_moves_the_stream_as_h2_send_headers_does(request_ended: bool, response_ended: bool) -> None:
    """OPEN or HALF_CLOSED_REMOTE, with or without END_STREAM: the whole state machine
    (state, headers_sent, who closed the stream) ends up as h2 leaves it."""
    ours, reference = pair(request_ended)
    stream = sendable_stream(ours, 1)
    assert stream is not None
    send_response_head([], ours, stream, 200, ((b"content-type", b"text/plain"),), response_ended)
    reference.send_headers(1, [(b":status", b"200"), (b"content-type", b"text/plain")], end_stream=response_ended)
    assert machine_state(ours) == machine_state(reference)
    expected = {
        (False, False): StreamState.OPEN,
        (False, True): StreamState.HALF_CLOSED_LOCAL,
        (True, False): StreamState.HALF_CLOSED_REMOTE,
        (True, True): StreamState.CLOSED,
    }
    assert machine_state(ours)["state"] is expected[request_ended, response_ended]


@given(request_ended=st.booleans())
def test_the_last_data_frame_closes_the_stream_as_h2_does(request_ended: bool) -> None:
    ours, reference = pair(request_ended)
    stream = sendable_stream(ours, 1)
    assert stream is not None
    send_response_head([], ours, stream, 200, (), False)
    reference.send_headers(1, [(b":status", b"200")])
    send_data([], ours, stream, b"body", True)
    reference.send_data(1, b"body", end_stream=True)
    assert machine_state(ours) == machine_state(reference)


def test_a_second_head_on_a_stream_is_refused_by_h2_as_ever() -> None:
    """Headers already sent: the state machine's own path (trailers without END_STREAM
    are a ProtocolError in h2, and the stream is closed)."""
    ours, reference = pair(True)
    stream = sendable_stream(ours, 1)
    assert stream is not None
    send_response_head([], ours, stream, 200, (), False)
    reference.send_headers(1, [(b":status", b"200")])
    outcomes = []
    for conn, send in (
        (ours, lambda: send_response_head([], ours, stream, 200, (), False)),
        (reference, lambda: reference.streams[1].state_machine.process_input(StreamInputs.SEND_HEADERS)),
    ):
        try:
            send()
            outcomes.append(("sent", machine_state(conn)))
        except Exception as exc:  # (compared below: the same type and state on both)
            outcomes.append((type(exc).__name__, machine_state(conn)))
    assert outcomes[0] == outcomes[1]


@given(
    sizes=st.lists(st.integers(0, 40000), max_size=40),
    window=st.sampled_from([1, 1024, 3000, 65535, 2**20]),
    consumed=st.lists(st.integers(0, 70000), max_size=40),
)
def test_counting_received_bytes_matches_h2_window_manager(sizes: list[int], window: int, consumed: list[int]) -> None:
    """``_process_bytes`` against ``WindowManager.process_bytes``: the same increments
    (or none) and the same manager state, whatever the window and the bytes consumed."""
    ours, reference = h2.windows.WindowManager(window), h2.windows.WindowManager(window)
    for size, used in zip(sizes, [*consumed, *[0] * len(sizes)], strict=False):
        used = min(used, ours.current_window_size)
        for manager in (ours, reference):
            manager.window_consumed(used)
        assert (h2_fastpath._process_bytes(ours, size) or 0) == (reference.process_bytes(size) or 0)
        assert vars(ours) == vars(reference)


@pytest.mark.parametrize("window", [1024, 65535])
@pytest.mark.parametrize(("consumed", "size"), [(0, -1), (0, 0), (1, -1), (1, 0), (-1, -1), (-1, 0), (-1, 1)])
def test_the_edges_of_a_due_window_update_are_h2s(window: int, consumed: int, size: int) -> None:
    """Half the window processed exactly (and one byte less), with the window untouched,
    partly or wholly consumed; a negative ``consumed`` consumes the whole window, and
    ``size`` is an offset from half the window (from 1024 bytes when it is exhausted)."""
    ours, reference = h2.windows.WindowManager(window), h2.windows.WindowManager(window)
    used = window if consumed < 0 else consumed * (window // 2)
    count = (min(1024, window // 4) if consumed < 0 else window // 2) + size
    for manager in (ours, reference):
        manager.window_consumed(used)
    assert (h2_fastpath._process_bytes(ours, count) or 0) == (reference.process_bytes(count) or 0)
    assert vars(ours) == vars(reference)


class PerStreamTrim(h2_fastpath.ServerConnection):
    """The walk of ``open_inbound_streams`` as it was: each closed stream remembered by
    the SizeLimitDict's own ``__setitem__`` (trimming after every one)."""

    @property
    def open_inbound_streams(self) -> int:
        streams = self.streams
        if len(streams) >= self._next_walk:
            closed = [sid for sid, stream in streams.items() if stream.state_machine.state is StreamState.CLOSED]
            for sid in closed:
                self._closed_streams[sid] = streams.pop(sid).state_machine.stream_closed_by
            self._next_walk = max(64, 2 * len(streams))
        return len(streams)


def test_closed_streams_are_forgotten_and_remembered_as_before() -> None:
    """1,500 requests on one connection, most answered (some reset, some left open): the
    same streams held, and the same closed ones remembered in the same order, as the
    per-stream trim left them; the memory stays a bounded SizeLimitDict."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    ours = server_connection(100, 65536, None)
    before = server_connection(100, 65536, None)
    before.__class__ = PerStreamTrim
    for batch in range(15):
        for n in range(100):
            client.send_headers(2 * (100 * batch + n) + 1, REQUEST, end_stream=True)
        data = client.data_to_send()
        for conn in (ours, before):
            conn.receive_data(data)
            for n in range(100):
                sid = 2 * (100 * batch + n) + 1
                if n % 7 == 3:
                    conn.reset_stream(sid)
                elif n % 11 != 5:
                    conn.send_headers(sid, [(b":status", b"204")], end_stream=True)
            conn.data_to_send()
        assert list(ours.streams) == list(before.streams)
        assert list(ours._closed_streams.items()) == list(before._closed_streams.items())
    assert isinstance(ours._closed_streams, SizeLimitDict)
    assert len(ours._closed_streams) == ours.MAX_CLOSED_STREAMS
    assert isinstance(ours._closed_streams, collections.OrderedDict)


async def test_a_handler_that_returns_without_ending_resets_its_stream(caplog: pytest.LogCaptureFixture) -> None:
    """``/noend`` decides its head and returns: the stream is reset (INTERNAL_ERROR), the
    log says why, and the connection goes on."""
    async with open_memory_connection(TestApp()) as mc:
        client = H2Client(mc.client)
        await client.start()
        record = await client.response(await client.request("/noend"))
        later = await client.response(await client.request("/echo"))
    assert record.reset == ErrorCodes.INTERNAL_ERROR
    assert "handler for GET /noend returned without ending its response" in caplog.text
    assert later.headers is not None and later.headers[b":status"] == b"200"
