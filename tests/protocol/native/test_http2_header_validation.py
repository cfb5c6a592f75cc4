"""Header blocks in and out of the server's H2Connection, against h2's own handling.

Inbound (RFC 9113 sections 8.1.1, 8.2 and 8.3): h2 treats every malformed request header
block as a connection error; the server makes a malformed request *head* a stream error
(RST_STREAM PROTOCOL_ERROR, the connection and its other streams go on), and malformed
trailers stay a connection error (GOAWAY PROTOCOL_ERROR naming the offending stream as
the last one).  The first part drives a real connection with one malformed block per
rule (and with the odd blocks h2 does accept, e.g. cookie crumbs ahead of the
pseudo-headers); the second feeds header blocks, every single odd field and random
combinations, to the server's H2Connection and to a stock h2 one, and requires
identical events, errors and bytes, except the reset where h2 would close.  The last part checks the hand-built
response HEADERS (``h2_fastpath.send_response_head``) against h2's ``send_headers``.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from h2.errors import ErrorCodes
from h2.settings import SettingCodes, Settings
from hpack import Encoder
from hyperframe.frame import HeadersFrame, PushPromiseFrame, RstStreamFrame, SettingsFrame
from hypothesis import given
from hypothesis import strategies as st

from llmsim.protocol.native.h2_fastpath import send_response_head, sendable_stream, server_connection
from tests.protocol.helpers import H2Client, StreamRecord, TestApp, open_memory_connection

Headers = list[tuple[bytes, bytes]]

METHOD, SCHEME, PATH, AUTHORITY = (
    (b":method", b"GET"),
    (b":scheme", b"http"),
    (b":path", b"/echo"),
    (b":authority", b"t"),
)
REQUEST = [METHOD, SCHEME, PATH, AUTHORITY]


def raw_client(mc_client: object) -> H2Client:
    """An h2 client that sends header blocks exactly as given (no checks, no lower-casing)."""
    config = h2.config.H2Configuration(
        client_side=True, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
    )
    return H2Client(mc_client, conn=h2.connection.H2Connection(config))  # type: ignore[arg-type]


async def exchange(head: Headers, trailers: Headers | None = None) -> tuple[H2Client, StreamRecord, TestApp, int]:
    """Send ``head`` (and ``trailers``) on a fresh connection; everything until the
    stream is answered, or the server closed the connection."""
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = raw_client(mc.client)
        await client.start()
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(sid, head, end_stream=trailers is None)
        if trailers is not None:
            client.conn.send_headers(sid, trailers, end_stream=True)
        await client.flush()
        client.records[sid] = record = StreamRecord()
        while not record.done and not client.eof:
            await client.pump()
    return client, record, app, sid


MALFORMED: dict[str, Headers] = {
    "uppercase name": [*REQUEST, (b"Content-Type", b"text/plain")],
    "empty name": [*REQUEST, (b"", b"x")],
    "space in name": [*REQUEST, (b"x y", b"1")],
    "colon inside name": [*REQUEST, (b"x:y", b"1")],
    "non-ASCII name": [*REQUEST, (b"x\xff", b"1")],
    "NUL in value": [*REQUEST, (b"x", b"a\x00b")],
    "CR in value": [*REQUEST, (b"x", b"a\rb")],
    "LF in value": [*REQUEST, (b"x", b"a\nb")],
    "leading space in value": [*REQUEST, (b"x", b" a")],
    "trailing tab in value": [*REQUEST, (b"x", b"a\t")],
    "connection": [*REQUEST, (b"connection", b"close")],
    "keep-alive": [*REQUEST, (b"keep-alive", b"5")],
    "proxy-connection": [*REQUEST, (b"proxy-connection", b"close")],
    "transfer-encoding": [*REQUEST, (b"transfer-encoding", b"chunked")],
    "upgrade": [*REQUEST, (b"upgrade", b"h2c")],
    "TE other than trailers": [*REQUEST, (b"te", b"gzip")],
    "pseudo-header after a regular one": [METHOD, SCHEME, PATH, (b"accept", b"*/*"), AUTHORITY],
    "duplicate pseudo-header": [*REQUEST, (b":path", b"/other")],
    "unknown pseudo-header": [*REQUEST, (b":foo", b"1")],
    "response pseudo-header": [*REQUEST, (b":status", b"200")],
    ":protocol without CONNECT": [*REQUEST, (b":protocol", b"websocket")],
    "missing :method": [SCHEME, PATH, AUTHORITY],
    "missing :scheme": [METHOD, PATH, AUTHORITY],
    "missing :path": [METHOD, SCHEME, AUTHORITY],
    "empty :path": [METHOD, SCHEME, (b":path", b""), AUTHORITY],
    "CONNECT with :path": [(b":method", b"CONNECT"), PATH, AUTHORITY],
    "neither :authority nor host": [METHOD, SCHEME, PATH],
    "host differs from :authority": [*REQUEST, (b"host", b"other")],
    "two host headers": [METHOD, SCHEME, PATH, (b"host", b"t"), (b"host", b"t")],
    "whitespace around joined cookie crumbs": [*REQUEST, (b"cookie", b""), (b"cookie", b"")],
}


@pytest.mark.parametrize("head", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_request_head_is_a_stream_error_and_the_connection_goes_on(head: Headers) -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = raw_client(mc.client)
        await client.start()
        held = await client.request("/hold")
        await app.holding.wait()
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(sid, head, end_stream=True)
        await client.flush()
        client.records[sid] = record = StreamRecord()
        await client.wait_until(lambda: record.done)
        later = await client.response(await client.request("/echo"))
        app.release.set()
        first = await client.response(held)
    assert record.reset == ErrorCodes.PROTOCOL_ERROR and record.headers is None
    assert later.headers is not None and later.headers[b":status"] == b"200"
    assert first.ended and first.body == b"data: first\n\ndata: last\n\n"
    assert not client.goaways and [r.path for r in app.requests] == ["/hold", "/echo"]


@pytest.mark.parametrize(
    "trailers",
    [[(b":path", b"/")], [(b"X", b"1")], [(b"x", b" 1")], [(b"connection", b"close")], [(b"te", b"gzip")]],
    ids=["pseudo-header", "uppercase", "whitespace", "connection", "te"],
)
async def test_malformed_trailers_get_goaway_protocol_error(trailers: Headers) -> None:
    client, record, app, sid = await exchange([(b":method", b"POST"), SCHEME, PATH, AUTHORITY], trailers)
    assert client.eof and [(g.error_code, g.last_stream_id) for g in client.goaways] == [
        (ErrorCodes.PROTOCOL_ERROR, sid)
    ]
    assert record.headers is None and record.reset is None and not app.requests


ACCEPTED: dict[str, tuple[Headers, Headers]] = {  # the head sent, the headers the app sees
    "plain": (REQUEST, [(b"host", b"t")]),
    "TE: trailers in any case": ([*REQUEST, (b"te", b"Trailers")], [(b"te", b"Trailers"), (b"host", b"t")]),
    "host equal to :authority": ([*REQUEST, (b"host", b"t")], [(b"host", b"t")]),
    "host without :authority": ([METHOD, SCHEME, PATH, (b"host", b"h")], [(b"host", b"h")]),
    "empty value": ([*REQUEST, (b"x", b"")], [(b"x", b""), (b"host", b"t")]),
    "inner whitespace in value": ([*REQUEST, (b"x", b"a \tb")], [(b"x", b"a \tb"), (b"host", b"t")]),
    # h2 joins cookie crumbs (RFC 9113 8.2.3) and moves them last, before validating.
    "cookie crumbs, joined and moved last": (
        [*REQUEST, (b"cookie", b"a=1"), (b"x", b"y"), (b"cookie", b"b=2")],
        [(b"x", b"y"), (b"cookie", b"a=1; b=2"), (b"host", b"t")],
    ),
    "cookie ahead of the pseudo-headers": ([(b"cookie", b"a=1"), *REQUEST], [(b"cookie", b"a=1"), (b"host", b"t")]),
    "whitespace inside joined cookie crumbs": (
        [*REQUEST, (b"cookie", b"a "), (b"cookie", b" b")],
        [(b"cookie", b"a ;  b"), (b"host", b"t")],
    ),
    "lower-case connect is not CONNECT": (
        [(b":method", b"connect"), SCHEME, PATH, AUTHORITY],
        [(b"host", b"t")],
    ),
}


@pytest.mark.parametrize(("head", "seen"), ACCEPTED.values(), ids=ACCEPTED.keys())
async def test_request_heads_h2_accepts_are_served(head: Headers, seen: Headers) -> None:
    client, record, app, _ = await exchange(head)
    assert record.headers is not None and record.headers[b":status"] == b"200"
    assert not client.goaways and [list(r.headers) for r in app.requests] == [seen]


@pytest.mark.parametrize(
    "head",
    [
        [(b":method", b"CONNECT"), AUTHORITY],
        [(b":method", b"CONNECT"), (b":protocol", b"websocket"), SCHEME, PATH, AUTHORITY],
    ],
    ids=["CONNECT", "extended CONNECT"],
)
async def test_connect_is_accepted_and_answered_by_the_app(head: Headers) -> None:
    client, record, app, _ = await exchange(head)
    assert record.headers is not None and not client.goaways
    assert [r.method for r in app.requests] == ["CONNECT"]


async def test_valid_trailers_are_accepted() -> None:
    client, record, app, _ = await exchange([(b":method", b"POST"), SCHEME, PATH, AUTHORITY], [(b"x-t", b"1")])
    assert record.headers is not None and record.headers[b":status"] == b"200"
    assert not client.goaways and len(app.requests) == 1


# --- the server's H2Connection against a stock h2 one ---------------------------------

LIMIT, HEADER_BYTES = 100, 65536
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize()


def reference_connection() -> h2.connection.H2Connection:
    """What the server's connection was before llmsim validated header blocks itself:
    h2's defaults for inbound headers, the same settings as ``server_connection``."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    for limit in (LIMIT, 2**31 - 1):
        conn.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: limit,
                SettingCodes.MAX_HEADER_LIST_SIZE: HEADER_BYTES,
            },
        )
        if limit == LIMIT:
            conn.initiate_connection()
    return conn


def outcome(conn: h2.connection.H2Connection, data: bytes) -> tuple:
    """Everything observable of ``conn`` receiving ``data``: events, error, bytes sent."""
    try:
        events = conn.receive_data(data)
    except h2.exceptions.ProtocolError as exc:
        result: tuple = ("error", type(exc), exc.error_code, str(exc))
    else:
        result = tuple(describe(event) for event in events)
    return result, conn.data_to_send()


def describe(event: h2.events.Event) -> tuple:
    headers = getattr(event, "headers", None)
    if headers is not None:
        headers = [(type(h).__name__, h[0], h[1]) for h in headers]
    stream_ended = getattr(event, "stream_ended", None)
    return type(event), getattr(event, "stream_id", None), headers, stream_ended is not None


PLAIN_NAMES = [b"accept", b"user-agent", b"content-length", b"a!#$%&'*+-.^_`|~09"]
PLAIN_VALUES = [b"", b"t", b"a b", b"12", b"\xff", b"\x01", b"\x02"]
ODD_NAMES = [
    *(name for name, _ in REQUEST),
    *(b":status", b":protocol", b":foo", b":", b"host", b"te", b"cookie", b"connection", b"upgrade"),
    *(b"transfer-encoding", b"keep-alive", b"proxy-connection", b"Accept", b"x-a:b", b"x a", b""),
    *(b"x\x00", b"\x7f", b"x\xff"),
]
ODD_VALUES = [
    *(b"", b"GET", b"POST", b"CONNECT", b"connect", b"http", b"/", b"trailers", b"Trailers", b"gzip", b" "),
    *(b" a", b"a ", b"\ta", b"a\t", b"a\x00b", b"a\rb", b"a\nb", b"\x01 a", b"a \x01"),
]
#: Odd names with a few values, and plain names with odd values.
ODD_FIELDS = [
    *((name, value) for name in ODD_NAMES for value in (b"t", b"", b"trailers", b"gzip", b"GET", b"CONNECT", b"a=1")),
    *((name, value) for name in PLAIN_NAMES for value in ODD_VALUES),
]
HEADERS = st.lists(
    st.one_of(st.sampled_from(ODD_FIELDS), st.tuples(st.sampled_from(PLAIN_NAMES), st.sampled_from(PLAIN_VALUES))),
    max_size=4,
)


@st.composite
def header_blocks(draw: st.DrawFn) -> Headers:
    """A plain request head with up to three edits: an odd field inserted anywhere, a
    value made odd, a field dropped or moved."""
    block = [
        *REQUEST,
        *draw(st.lists(st.tuples(st.sampled_from(PLAIN_NAMES), st.sampled_from(PLAIN_VALUES)), max_size=3)),
    ]
    for edit in draw(st.lists(st.sampled_from(["insert", "value", "drop", "move"]), max_size=3)):
        if edit == "insert" or not block:
            block.insert(draw(st.integers(0, len(block))), draw(st.sampled_from(ODD_FIELDS)))
            continue
        index = draw(st.integers(0, len(block) - 1))
        if edit == "value":
            block[index] = (block[index][0], draw(st.sampled_from(ODD_VALUES)))
        elif edit == "drop":
            del block[index]
        else:
            block.insert(draw(st.integers(0, len(block) - 1)), block.pop(index))
    return block


@st.composite
def requests(draw: st.DrawFn) -> tuple[Headers, Headers | None, bool]:
    """A head, maybe trailers (the head then without END_STREAM), and PRIORITY or not."""
    trailers = draw(st.one_of(st.none(), HEADERS, st.just(REQUEST)))
    return draw(header_blocks()), trailers, draw(st.booleans())


def headers_frame(encoder: Encoder, sid: int, block: Headers, end_stream: bool, priority: bool) -> bytes:
    frame = HeadersFrame(sid, data=encoder.encode(block), flags=["END_HEADERS"])
    if end_stream:
        frame.flags.add("END_STREAM")
    if priority:
        frame.flags.add("PRIORITY")
        frame.depends_on, frame.stream_weight = 0, 15
    return frame.serialize()


def compare(requests: list[tuple[Headers, Headers | None, bool]]) -> None:
    """Send each request (head, trailers or None, PRIORITY) on its own stream, frame by
    frame, to both connections; both must answer every frame alike."""
    encoder = Encoder()
    frames = [PREFACE]
    opening = {}
    for index, (head, trailers, priority) in enumerate(requests):
        sid = 2 * index + 1
        opening[len(frames)] = sid
        frames.append(headers_frame(encoder, sid, head, trailers is None, priority))
        if trailers is not None:
            frames.append(headers_frame(encoder, sid, trailers, True, False))
    compare_frames(frames, opening)


def compare_frames(frames: list[bytes], opening: dict[int, int] | None = None) -> None:
    """Both connections answer each frame alike, except that where h2 closes the
    connection for the frame at index i in ``opening`` (a request head), the server only
    resets that stream, ``opening[i]``, with PROTOCOL_ERROR."""
    ours, reference = server_connection(LIMIT, HEADER_BYTES, None), reference_connection()
    assert ours.data_to_send() == reference.data_to_send()
    for index, data in enumerate(frames):
        expected = outcome(reference, data)
        if expected[0][:1] == ("error",) and opening and index in opening:
            reset = RstStreamFrame(opening[index], error_code=ErrorCodes.PROTOCOL_ERROR).serialize()
            assert outcome(ours, data) == ((), reset), frames
            assert ours.stream_errors == 1
            return
        assert outcome(ours, data) == expected, frames
        if expected[0][:1] == ("error",):
            return  # a connection error: nothing more is read


def test_every_single_odd_field_or_value_is_handled_exactly_as_by_h2() -> None:
    """Each odd field after the pseudo-headers, before them, and as trailers; each
    pseudo-header with each odd value, or missing, or repeated; a whole request head as
    trailers."""
    plain = [*REQUEST, (b"accept", b"*/*")]
    compare([(plain, plain, False)])
    for field in ODD_FIELDS:
        compare([([*plain, field], None, False), ([field, *plain], None, False), (plain, [field], False)])
    for index, (name, _) in enumerate(REQUEST):
        for value in ODD_VALUES:
            compare([([*plain[:index], (name, value), *plain[index + 1 :]], None, False)])
        compare([([*plain[:index], *plain[index + 1 :]], None, False), ([*plain, plain[index]], None, False)])


def test_a_push_promise_from_the_client_is_refused_exactly_as_by_h2() -> None:
    """The one other header block h2 validates: a server refuses it before that."""
    encoder = Encoder()
    head = headers_frame(encoder, 1, REQUEST, False, False)
    promise = PushPromiseFrame(1, promised_stream_id=2, data=encoder.encode([(b"X", b" a")]), flags=["END_HEADERS"])
    compare_frames([PREFACE, head, promise.serialize()])


@given(st.lists(requests(), min_size=1, max_size=4))
def test_random_header_blocks_are_handled_exactly_as_by_h2(
    requests: list[tuple[Headers, Headers | None, bool]],
) -> None:
    compare(requests)


@given(st.lists(requests(), min_size=1, max_size=3), st.integers(2, 4))
def test_repeated_header_blocks_are_handled_exactly_as_by_h2(
    requests: list[tuple[Headers, Headers | None, bool]], times: int
) -> None:
    """The same requests again and again: from the second time on the same bytes (every
    field indexed), which the server's connection decodes and checks from memory
    (h2_inbound.CachingDecoder, and the verdict on an ordinary head)."""
    compare(requests * times)


def test_a_remembered_ordinary_head_sent_as_trailers_is_still_refused_as_by_h2() -> None:
    plain = [*REQUEST, (b"accept", b"*/*")]
    compare([(plain, None, False), (plain, None, False), (plain, None, False), (plain, plain, False)])


# --- the response head: h2_fastpath.send_response_head against h2's send_headers -----------

STATUSES = st.sampled_from([200, 204, 404, 500, 2000])
PRINTABLE = bytes(range(0x21, 0x7F))
FIELD_VALUES = st.one_of(
    st.sampled_from([b"", b"text/event-stream", b"a b"]),
    st.integers(1, 40000).map(lambda n: PRINTABLE * (n // len(PRINTABLE)) + b"x" * (n % len(PRINTABLE))),
)
FIELDS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([b"content-type", b"x-request-id", b"set-cookie"]), FIELD_VALUES),
        st.tuples(st.just(b"content-length"), st.just(b"0")),
    ),
    max_size=4,
)


@given(
    heads=st.lists(st.tuples(STATUSES, FIELDS, st.booleans(), st.booleans()), min_size=1, max_size=3),
    max_frame=st.sampled_from([16384, 16385, 20000]),
)
def test_response_heads_are_sent_exactly_as_by_h2(heads: list[tuple[int, Headers, bool, bool]], max_frame: int) -> None:
    """Each head (status, fields, request ended, response ended) on its own stream: the
    same bytes, stream states and HPACK state as h2's own ``send_headers``, and a client
    reads the head back."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.update_settings({SettingCodes.MAX_FRAME_SIZE: max_frame})
    client.decoder.max_header_list_size = 2**20  # heads of up to three CONTINUATION frames
    for index, (_, _, request_ended, _) in enumerate(heads):
        client.send_headers(2 * index + 1, REQUEST, end_stream=request_ended)
    ours, reference = server_connection(LIMIT, HEADER_BYTES, None), server_connection(LIMIT, HEADER_BYTES, None)
    request = client.data_to_send()
    ours.receive_data(request)
    reference.receive_data(request)
    client.receive_data(ours.data_to_send())
    assert reference.data_to_send()
    for index, (status, fields, _, end) in enumerate(heads):
        sid, head = 2 * index + 1, [(b":status", b"%d" % status), *fields]
        reference.send_headers(sid, head, end_stream=end)
        stream = sendable_stream(ours, sid)
        assert stream is not None
        out: list[bytes] = []
        send_response_head(out, ours, stream, status, tuple(fields), end)
        assert b"".join(out) == reference.data_to_send()
        assert state(ours, sid) == state(reference, sid)
        events = client.receive_data(b"".join(out))
        assert [list(e.headers) for e in events if isinstance(e, h2.events.ResponseReceived)] == [head]


def state(conn: h2.connection.H2Connection, sid: int) -> tuple:
    stream = conn.streams[sid]
    machine = stream.state_machine
    return machine.state, machine.headers_sent, machine.trailers_sent, stream.request_method, conn.state_machine.state
