"""The native :class:`~llmsim.api.http.ResponseStream`: one owner object per response.

An :class:`OutboundStream` holds everything about one response: the head the handler
decided, the body bytes not yet handed to the wire, the callbacks, and the cancel
scope of the handler task (the part both backends share is
:class:`~llmsim.protocol.response.BufferedResponse`).  The API side
(``start``/``write``/``end``) only appends and tells its :class:`NativeHost` (the
HTTP/1.1 or HTTP/2 connection) that there is something to send; whoever sends for
the connection — its writer task, or the engine task right after a step
(``Connection.flush_now``) — takes the bytes out (``take_head``/``take``), and reports back
(``flushed``, ``finish``, ``abort``).  When the stream ends, is reset or its
connection is lost, the connection drops this one object and nothing about the stream
remains anywhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, Self, TypeVar

import attrs

from llmsim.api.http import CLOSED_STATES, Application, HttpRequest, ResponseState
from llmsim.faults import FAULT_HEADER
from llmsim.protocol.native.faulty import FaultInjection, run_with_faults
from llmsim.protocol.native.handling import fail_if_unended, handler_failed
from llmsim.protocol.response import BufferedResponse, StreamHost

__all__ = ["NativeHost", "OutboundStream", "content_length", "run_handler", "split_target", "start_handler"]

# A handler that returned has usually ended its response (ENDED) or had it sent (DONE).
_ENDED, _DONE = ResponseState.ENDED, ResponseState.DONE
_NO_SCOPE = contextlib.nullcontext()  # (reusable: it holds nothing)


_StreamT = TypeVar("_StreamT", bound="OutboundStream", contravariant=True)
_Self = TypeVar("_Self", bound="OutboundStream")


class NativeHost(StreamHost[_StreamT], Protocol[_StreamT]):
    """The connection that owns a stream."""

    def fail(self, stream: _StreamT) -> None:
        """``stream``'s handler failed after its head was decided: abort it on the wire."""

    # The hooks of injected faults (:mod:`.faulty`; each a no-op once the stream is gone).
    @property
    def multiplexed(self) -> bool:
        """HTTP/2 (a GOAWAY can follow any event); False on HTTP/1.1 ("Connection: close" in the head)."""

    def inject_reset(self, stream: _StreamT, code: int) -> None:
        """Reset ``stream`` as a client's RST_STREAM would (HTTP/2: RST_STREAM ``code``;
        HTTP/1.1: close the connection mid-body)."""

    def inject_goaway(self, stream: _StreamT, code: int | None) -> None:
        """Accept no new requests; ``stream`` is the last one answered (``code`` None).
        With an error ``code``: GOAWAY(``code``) and close now (HTTP/1.1: close now)."""

    def inject_close(self, stream: _StreamT, mode: str = "fin") -> None:
        """Close the connection now, without GOAWAY or a last chunk; ``mode`` "rst" or
        "close-notify": see :meth:`.base.Transport.close_abruptly`."""

    def send_trailers(self, stream: _StreamT, fields: tuple[tuple[bytes, bytes], ...]) -> None:
        """End ``stream`` (everything written is on the wire) with these trailer fields."""

    def inject_frames(self, stream: _StreamT, kind: str, count: int) -> bool:
        """HTTP/2 frames beside ``stream``'s: ``count`` empty DATA frames ("empty-data"),
        a PING ("ping"), a SETTINGS ("settings") or ``count`` WINDOW_UPDATEs
        ("window-updates").  False (nothing sent) on HTTP/1.1 or once the stream is gone."""

    def write_padded(self, stream: _StreamT, data: bytes, padding: int) -> bool:
        """Send ``data`` as one DATA frame with ``padding`` bytes of padding (everything
        written before is taken); False if it cannot (HTTP/1.1, or the window or frame
        size is too small): then the caller writes it as usual."""

    def inject_head_frames(self, stream: _StreamT, size: int) -> bool:
        """Send ``stream``'s head (just decided) as HEADERS + CONTINUATION frames of
        ``size`` bytes of header block; False on HTTP/1.1."""


@attrs.define(eq=False, repr=False, kw_only=True)
class OutboundStream(BufferedResponse):
    """A response being produced by a handler and sent by a connection's writer."""

    host: NativeHost[Self]
    stream_id: int = 0  # the HTTP/2 stream id; 0 on HTTP/1.1
    _head_sent: bool = attrs.field(default=False, init=False)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.stream_id} {self.state.value} {self.status or '-'} {self.buffered}B>"

    @property
    def head_pending(self) -> bool:
        """The head is decided and the writer has not taken it yet."""
        return not self._head_sent and self.state.started

    @property
    def fully_taken(self) -> bool:
        """Everything the handler produced has been taken by the writer."""
        return self._head_sent and not self.buffered and self.state.ended

    def take_head(self) -> tuple[int, tuple[tuple[bytes, bytes], ...]]:
        self._head_sent = True
        return self.status, self.headers

    def fail(self: _Self, message: str) -> None:
        """The handler failed: a 500 with ``message`` if nothing was started, else the
        host aborts the response on the wire.  Nothing happens once it is closed."""
        if self.state.closed:
            return
        if not self.state.started:
            self.respond_error(500, message)
        else:
            self.host.fail(self)


def start_handler(
    spawn: Callable[..., object],
    app: Application,
    request: HttpRequest,
    stream: OutboundStream,
    faults: FaultInjection | None,
) -> None:
    """Answer ``request`` on ``stream``, from the task that read it.

    A request with an ``x-llmsim-fault`` header, or one ``faults`` picks for
    ``--fault`` (one roll per request), runs in a task through
    :func:`.faulty.run_with_faults`.  Otherwise an application that answers in two parts
    (``StartingApplication``) has its ``start`` called here and now, and only what that
    leaves to await runs in a task (``spawn``): a streaming request then costs no task
    at all; any other application runs whole in a task of its own (:func:`run_handler`).
    A request whose stream was reset before it got here never reaches the application
    (it would be parsed, tokenized, planned and queued for a client long gone)."""
    if stream.state in CLOSED_STATES:
        return
    header = _fault_header(request, faults)
    if header is not None:
        spawn(run_with_faults, app, request, stream, header, faults)
        return
    start = getattr(app, "start", None)
    if start is None:
        spawn(run_handler, app, request, stream)
        return
    try:
        rest = start(request, stream)
    except Exception:
        handler_failed(request, stream)
        return
    if rest is not None:
        spawn(_answer, app, request, stream, rest)


async def _answer(app: Application, request: HttpRequest, stream: OutboundStream, answer: Awaitable[None]) -> bool:
    """Await ``answer``, ``app``'s for ``request`` (the rest ``start`` left, or the whole
    ``handle``); one that raises is a failed handler.  True if it returned.

    An application that ends on its own once its response closes runs in no cancel
    scope of its own (entering and leaving one: ~42,000 instructions, a seventh of an
    HTTP/2 request's intake): ``stream.abort`` runs its close callbacks all the same."""
    with _NO_SCOPE if getattr(app, "ends_on_close", False) else stream.cancel_scope:
        try:
            await answer
        except Exception:
            handler_failed(request, stream)
            return False
    return True


def _fault_header(request: HttpRequest, faults: FaultInjection | None) -> bytes | None:
    """The faults ``request`` runs with: its ``x-llmsim-fault`` header, else those
    ``faults`` picks for ``--fault``, else None."""
    for name, value in request.headers:  # (a loop: a generator costs more, per request)
        if name == FAULT_HEADER:
            return value
    return faults.global_faults(request) if faults is not None else None


async def run_handler(app: Application, request: HttpRequest, stream: OutboundStream) -> None:
    """Run ``app.handle`` for one request (:func:`start_handler` spawns it); a handler
    that fails gets a 500 (or, if its head is already decided, the stream is aborted on
    the wire).  A request whose stream was reset before its task ran never reaches the
    application."""
    if stream.state in CLOSED_STATES:  # (state.closed, without the property's call)
        return
    if await _answer(app, request, stream, app.handle(request, stream)):
        state = stream.state
        if state is not _ENDED and state is not _DONE:
            fail_if_unended(request, stream)


def split_target(target: bytes) -> tuple[str, str]:
    """A request target as (path, query): ``/v1/models?a=1`` -> ``("/v1/models", "a=1")``.

    An absolute-form target (``http://host/path``, RFC 9112 section 3.2.2) keeps only
    its path.
    """
    if not target.startswith(b"/") and b"://" in target:
        target = b"/" + target.split(b"://", 1)[1].partition(b"/")[2]
    path, _, query = target.partition(b"?")
    return path.decode("latin-1"), query.decode("latin-1")


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The ``content-length`` of lower-cased request headers already validated (by h11
    or h2), or None if there is none."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None
