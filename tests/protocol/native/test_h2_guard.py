"""FrameGuard.scan's inline path for the frames of an ordinary request (a DATA frame
that carries bytes or ends its stream, a HEADERS frame holding a whole header block)
against the reference: every frame header accounted by ``FrameGuard._frame``, as
``scan`` did before it took those two frames itself.  Random frame sequences, cut into
reads at random points, must give the same answers and leave the same state."""

from __future__ import annotations

import itertools
import struct

import attrs
from h2.errors import ErrorCodes
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.protocol.native.h2_guard import _HEADER, PREFACE_SIZE, FrameGuard, TokenBucket

MAX_FRAME = 64
MAX_BLOCK = 100


class ReferenceGuard(FrameGuard):
    """``scan`` as it was: one ``_frame`` call per frame header."""

    def scan(self, data: bytes, now: float) -> tuple[int, ErrorCodes | None]:
        size = len(data)
        offset = min(self._skip, size)
        self._skip -= offset
        if self._partial:
            need = _HEADER.size - len(self._partial)
            head = self._partial + data[:need]
            if len(head) < _HEADER.size:
                self._partial = head
                return self._settle(size, now)
            self._partial = b""
            error = self._frame(head, 0, now)
            if error is not None:
                return 0, error
            offset = min(need + self._skip, size)
            self._skip -= offset - need
        while offset + _HEADER.size <= size:
            error = self._frame(data, offset, now)
            if error is not None:
                return offset, error
            start = offset + _HEADER.size
            offset = min(start + self._skip, size)
            self._skip -= offset - start
        if offset < size:
            self._partial = data[offset:]
        return self._settle(size, now)


def guard(cls: type[FrameGuard]) -> FrameGuard:
    # Small budgets, so that floods and oversized blocks are reached.
    return cls(
        max_frame_size=MAX_FRAME,
        max_block_size=MAX_BLOCK,
        max_unacked=3,
        control=TokenBucket(rate=1.0, capacity=4.0, tokens=4.0, stamp=0.0),
        resets=TokenBucket(rate=1.0, capacity=4.0, tokens=4.0, stamp=0.0),
    )


# (type, flags, length): DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, CONTINUATION.
frames = st.tuples(
    st.sampled_from([0x0, 0x0, 0x1, 0x1, 0x2, 0x3, 0x4, 0x6, 0x9]),
    st.sampled_from([0x0, 0x1, 0x4, 0x5, 0x8, 0x21]),
    st.sampled_from([0, 1, 6, 40, MAX_BLOCK - 1, MAX_FRAME, MAX_FRAME + 1]),
)


def wire(sequence: list[tuple[int, int, int]]) -> bytes:
    out = [b"P" * PREFACE_SIZE]
    for kind, flags, length in sequence:
        out.append(struct.pack(">HBBBL", length >> 8, length & 0xFF, kind, flags, 1) + b"x" * length)
    return b"".join(out)


@settings(max_examples=400, deadline=None)
@given(sequence=st.lists(frames, max_size=30), cuts=st.lists(st.integers(min_value=1, max_value=2000), max_size=8))
def test_scan_accounts_every_frame_as_the_reference_does(sequence: list[tuple[int, int, int]], cuts: list[int]) -> None:
    data = wire(sequence)
    points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    ours, reference = guard(FrameGuard), guard(ReferenceGuard)
    for index, (start, end) in enumerate(itertools.pairwise(points)):
        piece, now = data[start:end], float(index)
        assert ours.scan(piece, now) == reference.scan(piece, now)
        assert attrs.asdict(ours) == attrs.asdict(reference)


def test_an_ordinary_request_takes_the_inline_path_and_an_oversized_block_does_not() -> None:
    """The cases the inline path decides itself, at their limits."""
    for kind, flags, length, expected in [
        (0x1, 0x4, MAX_BLOCK, None),  # a whole header block, at the limit
        (0x1, 0x4, MAX_BLOCK + 1, ErrorCodes.ENHANCE_YOUR_CALM),  # over it (and over the frame size)
        (0x0, 0x1, 0, None),  # an empty DATA frame that ends its stream
        (0x0, 0x0, MAX_FRAME, None),
        (0x0, 0x0, MAX_FRAME + 1, ErrorCodes.FRAME_SIZE_ERROR),
    ]:
        ours = guard(FrameGuard)
        ours.max_frame_size = MAX_BLOCK + 10 if kind == 0x1 else MAX_FRAME
        data = wire([(kind, flags, length)])
        assert ours.scan(data, 0.0) == ((len(data), None) if expected is None else (PREFACE_SIZE, expected))
