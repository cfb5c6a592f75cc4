"""Incremental SSE parsing into a :class:`StreamRecord`.

Speed matters more than generality here: the load generator must consume events faster
than the fastest server under test produces them.  All events of one read arrive at the
same instant, so a read is handled in bulk: its complete events are counted with C-speed
byte searches (a chat chunk with non-empty ``choices`` contains ``"choices"`` and does
not match ``"choices": []``).  Only the few special events -- the usage chunk,
``[DONE]``, an error -- are located with a regular expression and decoded with orjson.
"""

from __future__ import annotations

import re

import orjson

from benchmarks.loadgen.records import StreamRecord

__all__ = ["ErrorBody", "SseReader", "body_reader"]

_CHOICES = b'"choices"'
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
#: Byte strings found in every event that is not a plain content event (an empty
#: ``choices`` list, the end, an error), and in few others.  Literal searches, because a
#: regular expression without a literal prefix crawls through a 100 kB read; ``feed``
#: spells them out inline, which is measurably cheaper than a loop over this tuple.
_MARKERS = (b"[]", b"[ ", b"[DONE]", b'"error"')


class SseReader:
    """Feeds one response body's bytes into a record."""

    __slots__ = ("_tail", "record")

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self._tail = b""

    def feed(self, data: bytes, now: float) -> None:
        """Consume a piece of the body that arrived at ``now``."""
        buffer = self._tail + data if self._tail else data
        if b"\r" in buffer:
            # SSE allows CRLF line ends; a CR left at the end of the tail is fixed next time.
            buffer = buffer.replace(b"\r\n", b"\n")
        if buffer.endswith(b"\n\n"):  # the usual case: reads end on an event boundary
            complete, self._tail = buffer, b""
        else:
            cut = buffer.rfind(b"\n\n")
            if cut < 0:
                self._tail = buffer
                return
            complete, self._tail = buffer[:cut], buffer[cut + 2 :]
        content = complete.count(_CHOICES)
        if b"[]" in complete or b"[ " in complete or b"[DONE]" in complete or b'"error"' in complete:
            content -= self._specials(complete, now)
        if content:
            self.record.on_events(content, now)

    def finish(self, now: float) -> None:
        """The body ended: a stream that never sent ``[DONE]`` is an error."""
        record = self.record
        if record.error is None and not record.done:
            record.fail("stream ended without [DONE]", now)
        record.end = now

    def _specials(self, complete: bytes, now: float) -> int:
        """Handle the events that hold a marker; return how many of them the bulk count
        wrongly took for content events (those with an empty ``choices``)."""
        overcounted = 0
        for start in sorted({_event_start(complete, at) for at in _positions(complete)}):
            end = complete.find(b"\n\n", start)
            data = _data(complete[start : end if end >= 0 else len(complete)])
            if _CHOICES in data:
                if _EMPTY_CHOICES.search(data) is None:
                    continue  # a content event whose text merely contains a marker
                overcounted += 1
            if data == b"[DONE]":
                self.record.done = True
            elif data:
                self._other(data, now)
        return overcounted

    def _other(self, data: bytes, now: float) -> None:
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.record.fail(f"undecodable event {data[:80]!r}", now)
            return
        if not isinstance(payload, dict):
            return
        if "error" in payload:
            self.record.fail(f"error event {data[:120]!r}", now)
        usage = payload.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.record.tokens = usage["completion_tokens"]


def _positions(complete: bytes) -> list[int]:
    """Every offset at which one of :data:`_MARKERS` occurs."""
    found = []
    for marker in _MARKERS:
        at = complete.find(marker)
        while at >= 0:
            found.append(at)
            at = complete.find(marker, at + 1)
    return found


def _event_start(complete: bytes, at: int) -> int:
    boundary = complete.rfind(b"\n\n", 0, at)
    return boundary + 2 if boundary >= 0 else 0


def _data(event: bytes) -> bytes:
    """The data of one event: its ``data:`` lines joined by newlines."""
    if event.startswith(b"data:") and b"\n" not in event:
        return event[5:].lstrip(b" ")
    return b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))


class ErrorBody:
    """Stands in for :class:`SseReader` when the status is not 200: keeps the body's start."""

    __slots__ = ("_head", "record")

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self._head = b""

    def feed(self, data: bytes, now: float) -> None:
        if len(self._head) < 200:
            self._head += data[:200]

    def finish(self, now: float) -> None:
        self.record.fail(f"HTTP {self.record.status}: {self._head[:200]!r}", now)
        self.record.end = now


def body_reader(record: StreamRecord) -> SseReader | ErrorBody:
    """The consumer for a response body, chosen by the status already in ``record``."""
    return SseReader(record) if record.status == 200 else ErrorBody(record)
