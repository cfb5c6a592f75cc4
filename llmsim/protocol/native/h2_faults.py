"""The HTTP/2 frames of injected faults (:mod:`.faulty`) that h2 or :mod:`.frames` build:
each function returns the bytes to send, h2's pending output first, with h2's state
(flow-control windows, stream states, settings) kept as if h2 had sent them itself."""

from __future__ import annotations

from h2.settings import SettingCodes
from hyperframe.frame import SettingsFrame

from llmsim.protocol.native.frames import FRAME_HEADER, data_frames, header_block_frames
from llmsim.protocol.native.h2_fastpath import ServerConnection

__all__ = ["PING_DATA", "control_frames", "head_frames", "padded_data"]

#: The opaque data of an injected PING (8 bytes, RFC 9113 6.7).
PING_DATA = b"llmsim!!"


def control_frames(h2conn: ServerConnection, stream_id: int, kind: str, count: int, max_streams: int) -> bytes:
    """``count`` empty DATA frames on ``stream_id`` ("empty-data"), a PING ("ping"), a
    SETTINGS re-announcing MAX_CONCURRENT_STREAMS ``max_streams`` ("settings", the client
    must ACK it), or ``count`` connection WINDOW_UPDATEs of 1 ("window-updates")."""
    out = [h2conn.data_to_send()]
    if kind == "empty-data":
        for _ in range(count):
            data_frames(out, stream_id, b"", 1, False)
    elif kind == "ping":
        h2conn.ping(PING_DATA)
    elif kind == "settings":
        # By hand: h2's own limit is lifted (h2_fastpath.server_connection), and h2
        # ignores the ACK of a SETTINGS it did not send.
        out.append(SettingsFrame(0, settings={SettingCodes.MAX_CONCURRENT_STREAMS: max_streams}).serialize())
    elif kind == "window-updates":
        for _ in range(count):
            h2conn.increment_flow_control_window(1)
    else:
        raise ValueError(f"unknown injected frame kind {kind!r}")
    out.append(h2conn.data_to_send())
    return b"".join(out)


def padded_data(h2conn: ServerConnection, stream_id: int, data: bytes, padding: int) -> bytes | None:
    """``data`` as one DATA frame (PADDED, ``padding`` bytes), through h2 so that the
    padding counts against the windows (RFC 9113 6.1); None if the frame would exceed a
    window or the peer's MAX_FRAME_SIZE."""
    size = len(data) + padding + 1
    if size > min(h2conn.local_flow_control_window(stream_id), h2conn.max_outbound_frame_size):
        return None
    before = h2conn.data_to_send()
    h2conn.send_data(stream_id, data, pad_length=padding)
    return before + h2conn.data_to_send()


def head_frames(h2conn: ServerConnection, stream_id: int, fields: list[tuple[bytes, bytes]], size: int) -> bytes:
    """The response head as HEADERS + CONTINUATION frames of at most ``size`` bytes of
    header block each (h2 encodes it and moves the stream on; the block is re-cut)."""
    out = [h2conn.data_to_send()]
    h2conn.send_headers(stream_id, fields, end_stream=False)
    frames = h2conn.data_to_send()
    block, offset = [], 0
    while offset < len(frames):
        high, low, _kind, _flags, _sid = FRAME_HEADER.unpack_from(frames, offset)
        length = high << 8 | low
        block.append(frames[offset + 9 : offset + 9 + length])
        offset += 9 + length
    header_block_frames(out, stream_id, b"".join(block), size, False)
    return b"".join(out)
