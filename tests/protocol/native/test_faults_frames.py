"""The frame-level, body-shaping and event faults of ``x-llmsim-fault`` (docs/faults.md):
the exact frames each puts on the wire (h2 as the client over a real socket) and the
HTTP/1.1 bytes where the fault has an HTTP/1.1 form; plus the engine's side (an
injected error event frees the slot at once)."""

from __future__ import annotations

import json
import ssl

import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes

from llmsim.faults import BAD_EVENT_KINDS
from llmsim.protocol.native.faulty import vllm_error_event
from llmsim.protocol.native.h2_faults import PING_DATA
from tests.protocol.native.faultwire import (
    DATA,
    END,
    HEAD,
    Wire,
    chunks,
    closed,
    completion,
    events,
    http1,
    shape,
    simulator,
)

#: A token every 20 ms: the handler keeps up even on a loaded machine, so each token is
#: one write (one event), the last with ``[DONE]``.
PACE = {"inter_token_latency": 0.02}


async def frames_of(fault: str, max_tokens: int = 3, **config: object) -> list[Wire]:
    """Every frame the client received for one faulted request (stream 1), connection
    frames (stream 0) included, minus the server's preface SETTINGS and its ACK."""
    async with simulator(**PACE, **config) as server:
        client = await server.h2()
        sid = await client.post(fault, max_tokens=max_tokens)
        await client.read_until(closed(sid))
    return [f for f in client.frames[2:] if f.stream_id in (0, sid)]


def is_event(data: bytes) -> bool:
    return data.startswith(b"data: ") and data.endswith(b"\n\n")


async def test_the_same_header_gives_the_same_frames(autojump_clock: trio.testing.MockClock) -> None:
    """Two runs of a seeded simulator: frame for frame (type, flags, length, padding).
    (On the autojump clock: on the real one, a step a loaded machine starts late sends
    two tokens in one write, and so one frame.)"""
    fault = "continuation=9; split-at=5; padding=3; empty-data=1; ping-after=1; bad-event=2:crlf; error-after=3"
    first, second = [await frames_of(fault, max_tokens=5, seed=11) for _ in range(2)]
    assert [(f.kind, f.flags, f.length, f.pad) for f in first] == [(f.kind, f.flags, f.length, f.pad) for f in second]
    assert len(first) > 15


async def test_goaway_with_an_error_code_is_abrupt() -> None:
    """GOAWAY(code) naming the last stream the client opened, then the connection
    closes: no END_STREAM, no RST_STREAM; the engine frees the slot."""
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("goaway-after=1,code=ENHANCE_YOUR_CALM", max_tokens=200)
        await client.read_until(lambda frames: False)  # to EOF
        stats = server.sim.engine.statistics()
    mine = [f for f in client.frames[2:] if f.stream_id in (0, sid)]
    assert shape(mine) == [HEAD, DATA, ("GoAway", frozenset(), ErrorCodes.ENHANCE_YOUR_CALM)]
    assert mine[-1].last_stream_id == sid and client.eof
    assert (stats.running, stats.cancelled, stats.finished) == (0, 1, 0)


async def test_delay_first_token_sends_the_head_then_waits() -> None:
    """The head comes first, the first token 300 ms after it at the earliest: measured
    from the request's sending, which precedes the head (from the head's arrival, a
    loaded machine that delivers the head late would shorten the gap)."""
    async with simulator() as server:
        client = await server.h2()
        sent_at = trio.current_time()
        sid = await client.post("delay-first-token=300", max_tokens=2)
        await client.read_until(lambda frames: any(f.kind == "Headers" for f in frames))
        await client.read_until(lambda frames: len(events(frames)) == 1)
        gap = trio.current_time() - sent_at
        await client.read_until(closed(sid))
    assert gap >= 0.3
    assert shape(client.on(sid))[0] == HEAD and shape(client.on(sid))[-1] == END


async def test_split_at_cuts_every_event_at_the_offsets() -> None:
    frames = await frames_of("split-at=3,10")
    assert shape(frames)[0] == HEAD and shape(frames)[-1] == END
    pieces = [f.data for f in frames[1:-1]]
    assert len(pieces) % 3 == 0 and len(pieces) >= 6
    for first, second, third in zip(pieces[::3], pieces[1::3], pieces[2::3], strict=True):
        assert (first, second) == (b"dat", b'a: {"id')
        assert is_event(first + second + third)


async def test_coalesce_sends_k_events_in_one_frame() -> None:
    frames = await frames_of("coalesce=2", max_tokens=4)
    assert shape(frames) == [HEAD, DATA, DATA, END]
    assert [data.count(b"data: ") for data in events(frames)] == [2, 3]  # the last: token 4 and [DONE]
    assert all(is_event(data) for data in events(frames))


async def test_empty_data_frames_before_every_event() -> None:
    frames = await frames_of("empty-data=2", max_tokens=2)
    assert shape(frames) == [HEAD, DATA, DATA, DATA, DATA, DATA, DATA, END]
    assert [f.length for f in frames[1:-1]] == [0, 0, frames[3].length, 0, 0, frames[6].length]
    assert frames[3].length and frames[6].length


async def test_padding_pads_every_data_frame() -> None:
    frames = await frames_of("padding=7")
    padded = frames[1:-1]
    assert shape(frames)[0] == HEAD and shape(frames)[-1] == END and len(padded) >= 2
    for frame in padded:
        assert frame.flags == {"PADDED"} and frame.pad == 7 and frame.length == len(frame.data) + 8
        assert is_event(frame.data)


async def test_continuation_cuts_the_response_head() -> None:
    frames = await frames_of("continuation=5")
    heads = [f for f in frames if f.kind in ("Headers", "Continuation")]
    assert heads[0].kind == "Headers" and heads[0].flags == frozenset()
    assert {f.kind for f in heads[1:]} == {"Continuation"} and heads[-1].flags == {"END_HEADERS"}
    assert all(f.length == 5 for f in heads[:-1]) and 1 <= heads[-1].length <= 5
    assert dict(heads[-1].fields)[b":status"] == b"200"
    assert frames[len(heads) :][-1].flags == {"END_STREAM"}


async def test_ping_after_sends_a_ping_between_events() -> None:
    frames = await frames_of("ping-after=1")
    assert shape(frames)[:3] == [HEAD, DATA, ("Ping", frozenset(), None)]
    assert frames[2].value == PING_DATA and frames[2].stream_id == 0
    assert shape(frames)[-1] == END


async def test_settings_after_reannounces_max_concurrent_streams() -> None:
    frames = await frames_of("settings-after=1")
    assert shape(frames)[:3] == [HEAD, DATA, ("Settings", frozenset(), None)]
    assert frames[2].value == {3: 1000}  # SETTINGS_MAX_CONCURRENT_STREAMS, as in the preface
    assert shape(frames)[-1] == END


async def test_window_update_storm_sends_count_increments_of_one() -> None:
    frames = await frames_of("window-update-storm=1:5")
    storm = frames[2:7]
    assert shape(frames)[:2] == [HEAD, DATA] and shape(frames)[7] == DATA
    assert [(f.kind, f.stream_id, f.value) for f in storm] == [("WindowUpdate", 0, 1)] * 5


@pytest.mark.parametrize("kind", BAD_EVENT_KINDS)
async def test_bad_event(kind: str) -> None:
    frames = await frames_of(f"bad-event=1:{kind}", max_tokens=4)
    datas = events(frames)
    assert is_event(datas[0]) and datas[-1].endswith(b"data: [DONE]\n\n")
    if kind == "bad-json":
        assert datas[1] == b'data: {"id": "cmpl-llmsim", "choices": [{"index": 0, "text": \n\n'
        with pytest.raises(json.JSONDecodeError):
            json.loads(datas[1].removeprefix(b"data: "))
    elif kind == "bare-data":
        assert datas[1] == b"data:\n\n"
    elif kind == "crlf":
        assert datas[1].startswith(b"data: {") and datas[1].endswith(b"\r\n\r\n") and b"\n\n" not in datas[1]
        assert b"\r\n" not in datas[0] and b"\r\n" not in datas[2]
    else:
        assert datas[1].startswith(b"event: message\ndata: {") and b"event:" not in datas[0] + datas[2]


async def test_error_after_sends_vllms_error_event_and_frees_the_slot() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("error-after=1", max_tokens=200)
        await client.read_until(closed(sid))
        stats = server.sim.engine.statistics()
    frames = client.on(sid)
    assert shape(frames) == [HEAD, DATA, DATA, END]
    error_line, done = events(frames)[1].split(b"\n\n")[:2]
    assert json.loads(error_line.removeprefix(b"data: ")) == {
        "error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
    }
    assert done == b"data: [DONE]"
    assert (stats.running, stats.cancelled, stats.finished) == (0, 1, 0)


def test_the_error_event_is_json_dumps_of_vllms_envelope() -> None:
    """json.dumps' separators (", ", ": "), field order message, type, param, code."""
    assert vllm_error_event(503) == (
        b'data: {"error": {"message": "Request failed; please retry", "type": "ServiceUnavailableError", '
        b'"param": null, "code": 503}}\n\ndata: [DONE]\n\n'
    )


# --- HTTP/1.1 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    ["padding=9", "continuation=3", "ping-after=1", "settings-after=1", "window-update-storm=1:3", "empty-data=1"],
)
async def test_http1_ignores_http2_only_faults(fault: str) -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, fault, max_tokens=2)
    head, payloads, rest = chunks(raw)
    assert head.startswith(b"HTTP/1.1 200 ") and rest == b"0\r\n\r\n"
    assert all(is_event(p) for p in payloads) and payloads[-1].endswith(b"data: [DONE]\n\n")


async def test_http1_split_at_cuts_chunks() -> None:
    async with simulator(**PACE) as server:
        raw = await http1(server.handle.port, "split-at=4", max_tokens=2)
    _, payloads, rest = chunks(raw)
    assert rest == b"0\r\n\r\n" and payloads[0] == payloads[2] == b"data"
    assert is_event(payloads[0] + payloads[1])


async def test_http1_error_after_ends_the_body_with_the_error_event() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "error-after=1,code=500", max_tokens=200)
        stats = server.sim.engine.statistics()
    _, payloads, rest = chunks(raw)
    assert len(payloads) == 2 and payloads[1] == vllm_error_event(500) and rest == b"0\r\n\r\n"
    assert (stats.running, stats.cancelled) == (0, 1)


async def test_http1_abrupt_goaway_closes_mid_body() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "goaway-after=1,code=INTERNAL_ERROR", max_tokens=200, close=False)
    head, payloads, rest = chunks(raw)
    assert b"connection: close" not in head.lower() and len(payloads) == 1 and rest == b""


async def test_http1_bad_event_crlf() -> None:
    async with simulator(**PACE) as server:
        raw = await http1(server.handle.port, "bad-event=0:crlf", max_tokens=3)
    _, payloads, _ = chunks(raw)
    # Event 0 alone ends in CRLF, the others as usual (however the chunks cut them: a late
    # step puts several events in one).
    body = b"".join(payloads)
    first, rest = body.split(b"\r\n\r\n", 1)
    assert first.startswith(b"data: {") and first.count(b"data: ") == 1 and b"\n" not in first
    assert rest.endswith(b"data: [DONE]\n\n") and b"\r" not in rest and rest.count(b"data: ") == 3


# --- how the connection closes -----------------------------------------------------------------


async def read_to_close(stream: trio.abc.Stream, fault: str) -> tuple[bytes, str]:
    """Send one HTTP/1.1 request with ``fault``; what arrived, and how it ended: "eof"
    (a clean end: FIN, over TLS after close_notify), or the error receiving raised.
    Then close our side (after a FIN the server waits up to ``CLOSE_LINGER``, 1 s, for it)."""
    body = completion(200)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-llmsim-fault: {fault}\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)
    received = b""
    try:
        while data := await stream.receive_some(65536):
            received += data
    except trio.BrokenResourceError as exc:
        return received, type(exc.__cause__).__name__
    finally:
        await trio.aclose_forcefully(stream)
    return received, "eof"


@pytest.mark.parametrize(("mode", "ending"), [("fin", "eof"), ("rst", "ConnectionResetError")])
async def test_close_after_with_a_fin_or_a_tcp_reset(mode: str, ending: str) -> None:
    async with simulator(**PACE) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.handle.port)
        received, how = await read_to_close(stream, f"close-after=1,mode={mode}")
        stats = server.sim.engine.statistics()
    assert how == ending and received.startswith(b"HTTP/1.1 200 ")
    assert (stats.running, stats.cancelled) == (0, 1)


@pytest.mark.parametrize(("mode", "ending"), [("fin", "SSLEOFError"), ("close-notify", "eof")])
async def test_close_after_over_tls_with_or_without_close_notify(mode: str, ending: str) -> None:
    """The client is strict (``https_compatible=False``): a close without close_notify is
    a truncation error, one after it a clean EOF."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    async with simulator(self_signed_certs=True, **PACE) as server:
        tcp = await trio.open_tcp_stream("127.0.0.1", server.handle.port)
        tls = trio.SSLStream(tcp, context, server_hostname="localhost", https_compatible=False)
        received, how = await read_to_close(tls, f"close-after=1,mode={mode}")
    assert how == ending and received.startswith(b"HTTP/1.1 200 ")
