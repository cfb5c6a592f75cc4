"""Every frame and chunk llmsim builds by hand, one builder per kind.

HTTP/2 (RFC 9113 section 4.1): :func:`data_frames` is the only builder of DATA frames,
:func:`header_block_frames` of HEADERS + CONTINUATION, :func:`goaway_frame` of GOAWAY.
HTTP/1.1: :func:`chunk` is the only builder of a chunk of a chunked body, :func:`last_chunk`
of its end.  They are
pure framing: no flow-control or state bookkeeping, which stays with h2 (through
:mod:`.h2_fastpath`) and h11.

HTTP/1.1 chunks are h11's ``ChunkedWriter`` output written directly: once h11 has sent
the response head and chose chunked framing (:func:`h11_sends_chunked`), a ``Data``
event changes nothing in h11's state (``SEND_BODY`` to ``SEND_BODY``) and the writer is
stateless.  ``tests/protocol/native/test_fastpath_frames.py`` checks each builder
byte for byte against hyperframe and h11.
"""

from __future__ import annotations

import struct

import h11
from hyperframe.frame import GoAwayFrame

__all__ = [
    "END_STREAM_FLAG",
    "FRAME_HEADER",
    "chunk",
    "data_frames",
    "goaway_frame",
    "h11_sends_chunked",
    "header_block_frames",
    "last_chunk",
]

#: A frame header: 24-bit length (as 16 + 8 bits), type, flags, stream id (RFC 9113 4.1).
FRAME_HEADER = struct.Struct(">HBBBL")
END_STREAM_FLAG = 0x1
_DATA, _HEADERS, _CONTINUATION, _END_HEADERS = 0x0, 0x1, 0x9, 0x4
_PACK_HEADER = FRAME_HEADER.pack


def data_frames(out: list[bytes], stream_id: int, data: bytes, max_frame: int, end_stream: bool) -> None:
    """Append to ``out`` the DATA frames carrying ``data`` (each payload at most
    ``max_frame`` bytes), END_STREAM on the last; ``b""`` with ``end_stream`` is one
    empty frame."""
    size = len(data)
    if size <= max_frame:  # one frame: the per-token case
        out.append(_PACK_HEADER(size >> 8, size & 0xFF, _DATA, END_STREAM_FLAG if end_stream else 0, stream_id))
        if size:
            out.append(data)
        return
    _split_frames(out, stream_id, data, max_frame, _DATA, _DATA, 0, END_STREAM_FLAG if end_stream else 0)


def header_block_frames(out: list[bytes], stream_id: int, block: bytes, max_frame: int, end_stream: bool) -> None:
    """Append to ``out`` the frames carrying the encoded header ``block``: HEADERS
    (END_STREAM if ``end_stream``), then CONTINUATION frames, each payload at most
    ``max_frame`` bytes, END_HEADERS on the last."""
    first_flags = END_STREAM_FLAG if end_stream else 0
    _split_frames(out, stream_id, block, max_frame, _HEADERS, _CONTINUATION, first_flags, _END_HEADERS)


def _split_frames(
    out: list[bytes],
    stream_id: int,
    block: bytes,
    max_frame: int,
    first_kind: int,
    rest_kind: int,
    first_flags: int,
    last_flags: int,
) -> None:
    """Append the frames that carry ``block`` in payloads of at most ``max_frame``
    bytes: the first of type ``first_kind`` with ``first_flags``, the others of
    ``rest_kind``, ``last_flags`` on the last (a single frame has both; ``b""`` is one
    empty frame)."""
    size = len(block)
    pack = _PACK_HEADER
    if size <= max_frame:
        out.append(pack(size >> 8, size & 0xFF, first_kind, first_flags | last_flags, stream_id))
        if size:
            out.append(block)
        return
    view = memoryview(block)
    last = (size - 1) // max_frame * max_frame  # offset of the last frame's payload
    for offset in range(0, size, max_frame):
        payload = view[offset : offset + max_frame]
        length = len(payload)
        kind, flags = (first_kind, first_flags) if offset == 0 else (rest_kind, 0)
        if offset == last:
            flags |= last_flags
        out.append(pack(length >> 8, length & 0xFF, kind, flags, stream_id))
        out.append(payload.tobytes())


def goaway_frame(last_stream_id: int, error_code: int = 0) -> bytes:
    """A GOAWAY frame (NO_ERROR unless told) naming ``last_stream_id`` as the last stream answered."""
    return GoAwayFrame(stream_id=0, last_stream_id=last_stream_id, error_code=error_code).serialize()


# --- HTTP/1.1 ------------------------------------------------------------------------


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body, as h11's ``ChunkedWriter`` writes it;
    ``b""`` for ``b""`` (an empty chunk would end the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data) if data else b""


def last_chunk(trailers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """The end of a chunked body, with ``trailers``, as h11's ``ChunkedWriter`` writes
    it for ``EndOfMessage(headers=trailers)``: the same fields, validated and normalised
    by h11 (it raises ``LocalProtocolError`` for what it would refuse to send), written
    Host first like h11's ``write_headers``."""
    if not trailers:
        return b"0\r\n\r\n"
    fields = h11.EndOfMessage(headers=list(trailers)).headers.raw_items()
    first = [field for field in fields if field[0].lower() == b"host"]
    rest = [field for field in fields if field[0].lower() != b"host"]
    return b"0\r\n" + b"".join(b"%s: %s\r\n" % field for field in first + rest) + b"\r\n"


def h11_sends_chunked(conn: object) -> bool:
    """Whether h11 frames the body being sent with chunked encoding (so that its
    ``Data`` events can be written with :func:`chunk` instead).  False when unsure
    (an h11 without these internals): then every ``Data`` goes through h11."""
    writer = getattr(conn, "_writer", None)
    return type(writer).__name__ == "ChunkedWriter" and type(writer).__module__ == "h11._writers"
