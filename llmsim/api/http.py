"""The seam between the connection handlers (``llmsim.protocol``) and the API.

``protocol/`` parses bytes into an :class:`HttpRequest`, creates one
:class:`ResponseStream` owner object per request (HTTP/1.1) or stream (HTTP/2), and
runs ``await app.handle(request, response)`` in a task it can cancel (or, natively,
``app.start`` at once and a task only for what it leaves: :class:`StartingApplication`).  The API never
touches sockets: it calls :meth:`ResponseStream.start`, :meth:`~ResponseStream.write`
and :meth:`~ResponseStream.end`, all synchronous and non-blocking.  Bytes written are
buffered on the stream; what every stream of a connection wrote during one engine step
leaves in one socket send for that connection (the protocol layer decides who sends:
see ``WriteCoalescer`` in :mod:`llmsim.protocol.native.connection`).

A response moves through the states of :mod:`llmsim.api.response_state` (re-exported
here); every implementation moves through the same table.  When the client goes away
(EOF, RST_STREAM, connection loss) the protocol layer closes the response, runs its
close callbacks and cancels the handler task (unless the application ends on close by
itself: see :class:`Application`).

Both sides also answer errors in one envelope: the protocol layer's own (400, 408,
413, 431, a failed handler's 500) in the same ``{"error": {...}}`` body as the API's,
made by :func:`error_body` with :data:`JSON_HEADERS`.  ``protocol/`` imports nothing
else from ``api/``.

``llmsim.testing.check_response_stream`` checks an implementation against the
promises written here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import orjson

from llmsim._version import __version__
from llmsim.api.response_state import (
    CLOSED_STATES,
    ENDED_STATES,
    NOT_STARTED_STATES,
    ResponseEvent,
    ResponseState,
    ResponseStateError,
    ResponseStateFlags,
    next_state,
)

__all__ = [
    "CLOSED_STATES",
    "ENDED_STATES",
    "JSON_HEADERS",
    "NOT_STARTED_STATES",
    "REASON_PHRASES",
    "VERSION_HEADER",
    "Application",
    "Headers",
    "HttpRequest",
    "InjectedFaults",
    "ResponseEvent",
    "ResponseState",
    "ResponseStateError",
    "ResponseStateFlags",
    "ResponseStream",
    "ResponseWrapper",
    "StartingApplication",
    "error_body",
    "next_state",
    "openai_error_type",
    "reason_phrase",
]

Headers = Sequence[tuple[bytes, bytes]]

REASON_PHRASES: dict[int, bytes] = {
    100: b"Continue",
    101: b"Switching Protocols",
    200: b"OK",
    201: b"Created",
    202: b"Accepted",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    409: b"Conflict",
    411: b"Length Required",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    417: b"Expectation Failed",
    422: b"Unprocessable Entity",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


def reason_phrase(status: int) -> bytes:
    """A reason phrase for every status (h2load --h1 counts an empty one as a failure)."""
    return REASON_PHRASES.get(status, b"Unknown")


#: llmsim's own version, on every response the API answers (``/version`` reports the
#: vLLM version simulated).
VERSION_HEADER: tuple[bytes, bytes] = (b"x-llmsim-version", __version__.encode())
JSON_HEADERS: tuple[tuple[bytes, bytes], ...] = ((b"content-type", b"application/json"), VERSION_HEADER)

_OPENAI_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    409: "ConflictError",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    431: "RequestHeaderFieldsTooLarge",
}


def openai_error_type(status: int) -> str:
    """The ``type`` of vLLM's (OpenAI's) error envelope for ``status``."""
    if status >= 500:
        return "InternalServerError"
    return _OPENAI_TYPES.get(status, "APIError")


def error_body(status: int, message: str, *, param: str | None = None, error_type: str | None = None) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` bytes for ``status``: vLLM's
    (OpenAI's) envelope, ``code`` the integer status (vLLM >= 0.10.1)."""
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": error_type or openai_error_type(status),
                "param": param,
                "code": status,
            }
        }
    )


@attrs.define(eq=False)
class InjectedFaults:
    """How many times each protocol fault was injected (``x-llmsim-fault``, ``--fault``):
    the protocol layer adds, ``/metrics`` reads (``llmsim:injected_faults_total``).
    ``declare`` names the faults reported from the start, at 0."""

    _counts: dict[str, int] = attrs.field(factory=dict, init=False)

    def declare(self, names: Sequence[str]) -> None:
        for name in names:
            self._counts.setdefault(name, 0)

    def add(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)


#: The names handlers look headers up by (a few constants), as the lower-case bytes
#: a request's header names are: looked up several times per request.
_HEADER_KEYS: dict[str, bytes] = {}
_HEADER_KEYS_KEPT = 256


@attrs.frozen
class HttpRequest:
    """A complete request: head and body.  Header names are lower-case bytes."""

    method: str
    path: str
    query: str = ""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    http_version: str = "1.1"
    scheme: str = "http"
    # When its first bytes arrived, on trio's clock (the engine's): the read that held the
    # request line / HEADERS frame, or the ASGI call.  A generated answer's TTFT counts
    # from here, not from after reading, parsing and planning.  None: not known (now).
    received_at: float | None = None

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), decoded as latin-1."""
        wanted = _HEADER_KEYS.get(name)
        if wanted is None:
            wanted = name.lower().encode("latin-1")
            if len(_HEADER_KEYS) < _HEADER_KEYS_KEPT:
                _HEADER_KEYS[name] = wanted
        for key, value in self.headers:
            if key == wanted:
                return value.decode("latin-1")
        return None


class ResponseStream(Protocol):
    """One response, owned by the connection handler.  Every method is non-blocking.

    The methods move the response through :class:`ResponseState` (``start``:
    IDLE -> STREAMING, ``end``: STREAMING -> ENDED; the backend then completes it,
    ENDED -> DONE, or closes it early when the client goes away).  Calls out of order
    raise :class:`ResponseStateError`, a ``RuntimeError``.  Once the client is gone,
    the calls are still accepted in order and what they write is dropped.
    """

    @property
    def state(self) -> ResponseState:
        """Where the response is (see :mod:`llmsim.api.response_state`)."""

    @property
    def closed(self) -> bool:
        """True once nothing more will be sent: the response went out in full (DONE), or
        the client went away (EOF, reset, connection loss) or the response was aborted
        before that.  Right after :meth:`end` it may still be False while the last bytes
        wait for the transport; it is True once the client has read them."""

    @property
    def ended(self) -> bool:
        """True once :meth:`end` was called (bytes may still wait to be sent)."""

    @property
    def started(self) -> bool:
        """True once :meth:`start` was called (the status line/HEADERS are decided)."""

    def start(self, status: int, headers: Headers) -> None:
        """Decide status and headers.  Content-Length in ``headers`` means a fixed body;
        without it the body is streamed (chunked on HTTP/1.1).  Called once; a second
        call raises :class:`ResponseStateError`."""

    def write(self, data: bytes) -> bool:
        """Append body bytes to the outbound buffer.  Returns False when the bytes the
        transport has not taken yet reach the high-water mark: the producer should
        pause until ``on_drained``.  Raises :class:`ResponseStateError` before
        :meth:`start` or after :meth:`end`.  Once the client is gone the bytes are
        dropped and True is returned (``on_close`` tells the producer)."""

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        """Append the last body bytes and finish the response, with ``trailers`` (lower-case
        field names) after the body: HTTP/2 sends them as a HEADERS frame with END_STREAM
        (gRPC's ``grpc-status``), HTTP/1.1 as the trailer section of a chunked body (they
        are dropped on a body with Content-Length), ASGI through the
        ``http.response.trailers`` extension where the server offers it (else dropped).
        Raises :class:`ResponseStateError` before :meth:`start` or when called twice."""

    def on_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once (from the transport's side) when the buffer falls below
        its low-water mark.  Called at once if it already is, or if the response is
        closed; a callback still waiting when the client goes away is dropped (the
        close callbacks and the handler's cancellation tell the producer)."""

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the client goes away (or the response is
        aborted) before :meth:`end`; at once if that already happened.  Never called
        for a response that ended, whatever becomes of its last bytes."""


class ResponseWrapper:
    """A :class:`ResponseStream` over ``inner`` that changes some of its calls: a subclass
    overrides what it changes, and every call it does not override is ``inner``'s own
    bound method (set on the instance, so passing a token through costs no extra call).
    ``state`` and its flags are ``inner``'s."""

    _PASSED = ("start", "write", "end", "on_drained", "on_close")

    def __init__(self, inner: ResponseStream) -> None:
        self._inner = inner
        for name in self._PASSED:
            if getattr(type(self), name) is getattr(ResponseWrapper, name):
                setattr(self, name, getattr(inner, name))

    @property
    def state(self) -> ResponseState:
        return self._inner.state

    @property
    def closed(self) -> bool:
        return self._inner.closed

    @property
    def started(self) -> bool:
        return self._inner.started

    @property
    def ended(self) -> bool:
        return self._inner.ended

    def start(self, status: int, headers: Headers) -> None:
        self._inner.start(status, headers)

    def write(self, data: bytes) -> bool:
        return self._inner.write(data)

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        self._inner.end(data, trailers)

    def on_drained(self, callback: Callable[[], None]) -> None:
        self._inner.on_drained(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        self._inner.on_close(callback)


class Application(Protocol):
    """What both the native handlers and the ASGI adapter serve.

    An application may say ``ends_on_close = True`` (a class attribute): each of its
    handlers returns soon after its response's ``on_close`` callbacks ran, by itself,
    so that the backend need not be able to cancel it when the client goes away, and
    the native backend runs it in no cancel scope of its own (a cancel scope per
    request costs about as much as parsing its head).  Without it, the backend cancels
    the handler.  Either way, shutdown cancels every handler still running.

    An application may also answer in two parts (:class:`StartingApplication`): a
    synchronous ``start`` that the native backend calls in the task that read the
    request, and the awaitable it returns for the rest, if any.  A request that needs
    no wait (a stream the engine writes and ends) then costs no task at all: a task
    per request, its scheduling and its wake-up cost as much as parsing an HTTP/2
    request's head.
    """

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        """Answer ``request`` on ``response``.  Must call ``response.end`` unless cancelled.

        The backend runs this in a task it cancels when the client goes away (unless
        the application ``ends_on_close``, above).  If it
        raises before :meth:`ResponseStream.start`, the client gets a 500 in the
        :func:`error_body` envelope; if it raises after, the response is aborted and
        closed: the client never sees it complete (HTTP/2: RST_STREAM; HTTP/1.1: the
        connection closes mid-body).
        """


class StartingApplication(Application, Protocol):
    """An :class:`Application` that answers in two parts: ``handle(request, response)``
    is ``rest = start(request, response)``, then ``await rest`` unless it is None, then
    a wait until the response ended or closed."""

    def start(self, request: HttpRequest, response: ResponseStream) -> Awaitable[None] | None:
        """Answer ``request`` as far as can be done without waiting, and return what is
        left to await (None: nothing).  Called in the task that read the request, so it
        must not wait or block; raising counts as :meth:`Application.handle` raising.

        The response need not have ended when nothing is left to await: what ``start``
        began (the engine's steps) ends it, or the client's close does.  (So the
        backend's check for a handler that forgot to ``end`` applies to ``handle`` only.)
        """
