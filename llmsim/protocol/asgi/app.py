"""The llmsim :class:`~llmsim.api.http.Application` as an ASGI 3 application.

This is the reference the native connection handlers are measured against, so it
goes through the same seam: one :class:`AsgiResponseStream` per request, written to
synchronously by the API and pumped to ``send()`` by the ASGI task.

Per ``http`` scope the task (1) reads the whole body, (2) runs the handler beside
the pump and a disconnect watcher, and (3) when ``http.disconnect`` arrives, cancels
the handler and the pump and runs the close callbacks.  The watcher is a dedicated
task blocked in ``receive()``: under trio, ``receive()`` called in an
already-cancelled scope never sees a queued disconnect (hypercorn issue #210), so
nothing here polls.

The last send is the exception.  hypercorn delivers ``http.disconnect`` to every
request, from inside that send, once the response is complete; so the response
counts as complete as soon as that send begins, and the send is shielded from the
watcher.  On HTTP/2 it waits for the stream's buffer to drain, which never happens
once the TCP connection has dropped, so it is bounded by a timeout instead.  A
disconnect seen before it begins means it is never sent.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs
import trio

from llmsim.api.http import Application, HttpRequest
from llmsim.protocol.asgi.stream import AsgiResponseStream
from llmsim.protocol.settings import ConnectionTracker

if TYPE_CHECKING:  # the ASGI message types; hypercorn itself loads only when served
    from hypercorn.typing import ASGIReceiveCallable as Receive
    from hypercorn.typing import ASGISendCallable as Send
    from hypercorn.typing import HTTPScope, Scope

__all__ = ["AsgiApp", "request_from_scope"]

log = logging.getLogger("llmsim.protocol.asgi.app")


class _ClientGone(Exception):
    """``http.disconnect`` arrived while the request body was being read."""


@attrs.define(eq=False)
class AsgiApp:
    """ASGI 3 ``(scope, receive, send)`` callable serving ``app``.

    Args:
        app: what answers the requests.
        tracker: counts active streams and requests served.
        max_body_size: larger request bodies are answered 413 (after being drained,
            so that the client, still sending, can read the answer).
        final_send_timeout: bound on the last ``send()`` of a response (see module doc);
            on a live connection the bytes still go out after it, it only stops waiting.
    """

    app: Application
    tracker: ConnectionTracker = attrs.field(factory=ConnectionTracker)
    max_body_size: int = 4 * 1024 * 1024
    final_send_timeout: float = 5.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1000, "reason": None})  # ASGI's defaults
        else:
            raise ValueError(f"unsupported ASGI scope type {scope['type']!r}")

    async def _http(self, scope: HTTPScope, receive: Receive, send: Send) -> None:
        """One request, counted.  ASGI hides connections from the app, so each request
        counts as a connection of its own in ``open_connections``."""
        self.tracker.connection_opened()
        self.tracker.stream_opened()
        try:
            if await self._serve(scope, receive, send):
                self.tracker.request_served()
        finally:
            self.tracker.stream_closed()
            self.tracker.connection_closed()

    async def _serve(self, scope: HTTPScope, receive: Receive, send: Send) -> bool:
        """Answer one request; True if the response was sent to its end."""
        received_at = trio.current_time()  # hypercorn says nothing earlier: the call's start
        try:
            body = await _read_body(receive, self.max_body_size)
        except _ClientGone:
            return False
        if body is None:
            stream = AsgiResponseStream()
            stream.respond_error(413, f"Request body too large: the limit is {self.max_body_size} bytes.")
            return await self._pump_until_disconnect(stream, receive, send)
        request = request_from_scope(scope, body, received_at)
        return await self._respond(request, receive, send, _takes_trailers(scope))

    async def _respond(self, request: HttpRequest, receive: Receive, send: Send, trailers: bool = False) -> bool:
        stream = AsgiResponseStream(send_trailers=trailers)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_handler, request, stream)
            return await self._pump_until_disconnect(stream, receive, send)

    async def _pump_until_disconnect(self, stream: AsgiResponseStream, receive: Receive, send: Send) -> bool:
        """The pump, and a watcher that stops it when the client leaves."""
        served = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_disconnect, receive, stream, nursery.cancel_scope)
            served = await self._pump(stream, send)
            nursery.cancel_scope.cancel()
        return served

    async def _run_handler(self, request: HttpRequest, stream: AsgiResponseStream) -> None:
        """``app.handle``, with a 500 for a handler that fails or forgets to answer.

        A handler that fails after deciding its head has its response closed here and
        is left to raise: only the server can abort a started response on the wire
        (hypercorn logs it and cuts the stream).
        """
        try:
            with stream.cancel_scope:
                await self.app.handle(request, stream)
        except Exception:
            if stream.started:
                stream.abort()
                raise
            log.exception("handler for %s %s failed", request.method, request.path)
            stream.respond_error(500, "the server failed while answering this request; see the server log")
            return
        if not stream.ended and not stream.closed:
            log.error("handler for %s %s returned without ending its response", request.method, request.path)
            if stream.started:
                stream.end()
            else:
                stream.respond_error(500, "the server returned without completing this response; see the server log")

    async def _pump(self, stream: AsgiResponseStream, send: Send) -> bool:
        """Send the head, then one body message per wake-up, until the end.
        True if the last message was delivered."""
        await stream.wait_pending()
        head = {"type": "http.response.start", "status": stream.status, "headers": list(stream.headers)}
        await send({**head, "trailers": True} if stream.send_trailers else head)  # type: ignore[arg-type]
        while True:
            body = stream.take_all()
            if stream.ended:
                return await self._send_last(stream, send, body)
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
                stream.flushed()
            await stream.wait_pending()

    async def _send_last(self, stream: AsgiResponseStream, send: Send, body: bytes) -> bool:
        """The ``more_body=False`` message: shielded from the disconnect watcher, since
        hypercorn reports ``http.disconnect`` from inside this very send when a response
        completes, and a cancellation there would cut its connection bookkeeping short.
        Bounded instead: on HTTP/2 this send never returns once the connection dropped."""
        if stream.closed:
            return False
        stream.finish()
        with trio.move_on_after(self.final_send_timeout, shield=True) as scope:
            await send({"type": "http.response.body", "body": body, "more_body": False})
            if stream.send_trailers:
                await send({"type": "http.response.trailers", "headers": list(stream.trailers), "more_trailers": False})
        return not scope.cancelled_caught


def _takes_trailers(scope: HTTPScope) -> bool:
    """The server offers ASGI's ``http.response.trailers`` extension and the client said
    ``te: trailers`` (hypercorn sends trailers only then; gRPC clients always say it):
    every response then ends with a trailers message, empty unless ``end`` gave some."""
    extensions = scope.get("extensions") or {}
    return "http.response.trailers" in extensions and any(
        name.lower() == b"te" and b"trailers" in value for name, value in scope["headers"]
    )


def request_from_scope(scope: HTTPScope, body: bytes, received_at: float | None = None) -> HttpRequest:
    """The :class:`HttpRequest` of an ASGI ``http`` scope.

    The path is ``raw_path`` (not percent-decoded, as the native handlers see the
    request target) when the server gives it.
    """
    raw_path: bytes | None = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else scope["path"]
    return HttpRequest(
        method=scope["method"],
        path=path,
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=tuple((bytes(name).lower(), bytes(value)) for name, value in scope["headers"]),
        body=body,
        http_version=scope.get("http_version", "1.1"),
        scheme=scope.get("scheme", "http"),
        received_at=received_at,
    )


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None if it is over ``limit`` bytes.

    An oversized body is still read to its end and dropped: hypercorn feeds body
    chunks into a small bounded queue, and an app that stops reading blocks the
    connection's reader, and with it the disconnect that would end this task.
    """
    body = bytearray()
    too_large = False
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk, more_body = b"", False  # (both keys are optional in ASGI)
        if message["type"] == "http.request":
            chunk, more_body = message.get("body", b""), message.get("more_body", False)
        too_large = too_large or len(body) + len(chunk) > limit
        if not too_large:
            body += chunk
        if not more_body:
            return None if too_large else bytes(body)


async def _watch_disconnect(receive: Receive, stream: AsgiResponseStream, pump: trio.CancelScope) -> None:
    """Wait for ``http.disconnect``; then abort ``stream`` (which cancels its handler
    unless the response was complete) and cancel the ``pump`` (its last send is
    shielded): a body send can block forever on a dropped HTTP/2 connection too."""
    while (await receive())["type"] != "http.disconnect":
        pass
    stream.abort()
    pump.cancel()


async def _lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge startup and shutdown.  Not implementing lifespan crashes
    ``hypercorn.trio.serve`` (the lifespan channel closes before startup is sent)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
