"""Incremental SSE parsing into a :class:`StreamRecord`.

Speed matters more than generality here: the load generator must consume events faster
than the fastest server under test produces them.  All events of one read arrive at the
same instant, so a read is handled in bulk: the complete events in it are counted with
C-speed byte searches (a chat chunk with non-empty ``choices`` contains ``"choices"``
and does not match ``"choices": []``).  Only a read holding something else -- the usage
chunk, ``[DONE]``, an error -- is walked event by event, and only those few events are
decoded with orjson.
"""

from __future__ import annotations

import re

import orjson

from benchmarks.loadgen.records import StreamRecord

__all__ = ["ErrorBody", "SseReader", "body_reader"]

_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_CHOICES = b'"choices"'


class SseReader:
    """Feeds one response body's bytes into a record."""

    __slots__ = ("record", "_tail")

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self._tail = b""

    def feed(self, data: bytes, now: float) -> None:
        """Consume a piece of the body that arrived at ``now``."""
        buffer = self._tail + data if self._tail else data
        if b"\r" in buffer:
            # SSE allows CRLF line ends; a CR left at the end of the tail is fixed next time.
            buffer = buffer.replace(b"\r\n", b"\n")
        cut = buffer.rfind(b"\n\n")
        if cut < 0:
            self._tail = buffer
            return
        complete, self._tail = buffer[:cut], buffer[cut + 2 :]
        if b"[DONE]" in complete or b'"error"' in complete or _EMPTY_CHOICES.search(complete):
            content = self._walk(complete, now)
        else:
            content = complete.count(_CHOICES)
        if content:
            self.record.on_events(content, now)

    def finish(self, now: float) -> None:
        """The body ended: a stream that never sent ``[DONE]`` is an error."""
        record = self.record
        if record.error is None and not record.done:
            record.fail("stream ended without [DONE]", now)
        record.end = now

    def _walk(self, complete: bytes, now: float) -> int:
        """Event by event: handle the special ones, return how many were content events."""
        content = 0
        for event in complete.split(b"\n\n"):
            if event.startswith(b"data:") and b"\n" not in event:
                data = event[5:].lstrip(b" ")
            else:
                data = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
            if _CHOICES in data and _EMPTY_CHOICES.search(data) is None:
                content += 1
            elif data == b"[DONE]":
                self.record.done = True
            elif data:
                self._other(data, now)
        return content

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


class ErrorBody:
    """Stands in for :class:`SseReader` when the status is not 200: keeps the body's start."""

    __slots__ = ("record", "_head")

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
