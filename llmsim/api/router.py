"""Method + path -> handler, and the Application that answers every request.

Paths are exact (``/v1/models``) or carry ``{name}`` segments
(``/v1/responses/{response_id}``).  A request goes to the exact route of its path if it
has the method, else to the first pattern that matches with the method (so
``POST /v1/responses/render`` is the render endpoint and ``GET /v1/responses/render``
asks for a stored response, as in vLLM's Starlette app).  An unknown path is 404, a known
path with another method 405 with an ``Allow`` header, both in the error envelope of the
route family (Anthropic's for ``/v1/messages``, vLLM's elsewhere).

A family may also claim every ``POST`` whose ``Content-Type`` starts with a prefix,
whatever its path (:meth:`Router.add_content_type`): gRPC (``application/grpc``, the
path names the method) answers unknown paths itself, with its own status codes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

import attrs
import trio

from llmsim.api.auth import authorized, send_unauthorized
from llmsim.api.context import ApiContext, Call, clear_request_adapter
from llmsim.api.errors import JSON_HEADERS, ApiError, ResponseClosed
from llmsim.api.http import Headers, HttpRequest, ResponseStream, ResponseWrapper

__all__ = ["Api", "ErrorStyle", "Handler", "Router"]

log = logging.getLogger("llmsim.api")

#: A route's handler: an ``async def`` (the whole answer awaits), or a plain function that
#: answers as far as it can at once and returns what is left to await (None: nothing;
#: e.g. a stream the engine writes and ends).  Either way it is called in
#: ``Api.start``, and what it returns is awaited in ``Api``'s rest.
Handler = Callable[[Call], Awaitable[None] | None]

# What an exact route captures (nothing), shared by all its requests.
_NO_PARAMS: Mapping[str, str] = MappingProxyType({})


class ErrorStyle:
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


@attrs.frozen
class _Route:
    segments: tuple[str, ...]
    handlers: dict[str, Handler]
    error_style: str

    def match(self, segments: tuple[str, ...]) -> dict[str, str] | None:
        if len(segments) != len(self.segments):
            return None
        params: dict[str, str] = {}
        for pattern, actual in zip(self.segments, segments, strict=True):
            if pattern.startswith("{") and pattern.endswith("}"):
                if not actual:
                    return None
                params[pattern[1:-1]] = actual
            elif pattern != actual:
                return None
        return params


@attrs.frozen
class Resolved:
    handler: Handler
    params: Mapping[str, str]
    error_style: str
    #: The handler waits for something its response's close does not end: Api runs it
    #: in a cancel scope the close cancels (see Api.ends_on_close).
    cancel_on_close: bool = False


def _handler(route: _Route, method: str) -> Handler | None:
    """``route``'s handler for ``method`` (upper case); HEAD falls back to GET."""
    handler = route.handlers.get(method)
    if handler is None and method == "HEAD":
        handler = route.handlers.get("GET")
    return handler


class Router:
    def __init__(self) -> None:
        self._exact: dict[str, _Route] = {}
        self._patterns: list[_Route] = []
        # Exact routes' answers, by (method, path) as sent:
        self._resolved: dict[tuple[str, str], Resolved] = {}
        self._content_types: list[tuple[str, Resolved]] = []  # (content-type prefix, its handler)
        self._cancelled_on_close: set[Handler] = set()  # see add

    def add(
        self,
        method: str,
        path: str,
        handler: Handler,
        *,
        error_style: str = ErrorStyle.OPENAI,
        cancel_on_close: bool = False,
    ) -> None:
        """Route ``method path`` to ``handler``.  ``cancel_on_close``: the handler waits
        for something other than its jobs (``generation.stream_to_end`` and
        ``PendingJobs.finished`` end when the response closes, and a handler that never
        waits needs nothing), so it must be cancelled when the client goes away."""
        if cancel_on_close:
            self._cancelled_on_close.add(handler)
        segments = tuple(path.split("/"))
        is_pattern = any(s.startswith("{") for s in segments)
        table = self._patterns if is_pattern else None
        route = self._find(segments, is_pattern)
        if route is None:
            route = _Route(segments, {}, error_style)
            if table is not None:
                table.append(route)
            else:
                self._exact[path] = route
        route.handlers[method.upper()] = handler
        self._resolved.clear()

    def add_content_type(self, prefix: str, handler: Handler, *, cancel_on_close: bool = False) -> None:
        """Every ``POST`` whose Content-Type starts with ``prefix`` goes to ``handler``,
        whatever its path (checked before the paths); ``cancel_on_close`` as for :meth:`add`."""
        resolved = Resolved(handler, _NO_PARAMS, ErrorStyle.OPENAI, cancel_on_close=cancel_on_close)
        self._content_types.append((prefix, resolved))

    def resolve_request(self, request: HttpRequest) -> Resolved:
        """The handler for ``request``: its content type's family, else its path's
        (:meth:`resolve`, which raises the 404 / 405)."""
        if self._content_types and request.method == "POST":
            content_type = request.header("content-type") or ""
            for prefix, resolved in self._content_types:
                if content_type.startswith(prefix):
                    return resolved
        return self.resolve(request.method, request.path)

    def _find(self, segments: tuple[str, ...], is_pattern: bool) -> _Route | None:
        if not is_pattern:
            return self._exact.get("/".join(segments))
        return next((r for r in self._patterns if r.segments == segments), None)

    def resolve(self, method: str, path: str) -> Resolved:
        """The handler for ``method path``, or ApiError 404 / 405.

        An exact route's answer is remembered: it is the same for every request (and
        the client's method spellings of one route are few)."""
        resolved = self._resolved.get((method, path))
        if resolved is None:
            resolved = self._resolve(method, path)
            if path in self._exact:
                self._resolved[(method, path)] = resolved
        return resolved

    def _resolve(self, method: str, path: str) -> Resolved:
        """An exact route with the method wins; else the first pattern that matches with
        it, as Starlette matches (a POST-only ``/v1/responses/render`` leaves GET to
        ``/v1/responses/{response_id}``); else a 405 naming the first matching route's
        methods, or a 404."""
        method = method.upper()
        exact = self._exact.get(path)
        if exact is not None:
            handler = _handler(exact, method)
            if handler is not None:
                return self._resolved_to(handler, _NO_PARAMS, exact.error_style)
        matched = exact
        segments = tuple(path.split("/"))
        for candidate in self._patterns:
            params = candidate.match(segments)
            if params is None:
                continue
            handler = _handler(candidate, method)
            if handler is not None:
                return self._resolved_to(handler, params, candidate.error_style)
            matched = matched or candidate
        if matched is None:
            raise ApiError(404, f"Not Found: no route for {path}")
        allow = ", ".join(sorted(matched.handlers)).encode()
        raise ApiError(
            405,
            f"Method Not Allowed: {method} is not supported on {path}; use {allow.decode()}",
            headers=((b"allow", allow),),
        )

    def _resolved_to(self, handler: Handler, params: Mapping[str, str], error_style: str) -> Resolved:
        return Resolved(handler, params, error_style, cancel_on_close=handler in self._cancelled_on_close)

    def error_style_for(self, path: str) -> str:
        route = self._exact.get(path)
        if route is None:
            segments = tuple(path.split("/"))
            route = next((r for r in self._patterns if r.match(segments) is not None), None)
        return route.error_style if route is not None else ErrorStyle.OPENAI


class Api:
    """The :class:`~llmsim.api.http.Application` of llmsim: routes, runs, and turns errors
    into envelopes.  An ApiError after the response started is the handler's to report
    in-band; here it can only end the stream.  Any other exception after the start is
    re-raised, so that the protocol layer aborts the response on the wire.

    It ends on close (``ends_on_close``): a handler returns soon after its response
    closed without being cancelled, since the only waits of the generating endpoints
    (``generation.stream_to_end`` and ``PendingJobs.finished``) end at the close, most
    handlers never wait, and the few that wait for something else
    (``Router.add(..., cancel_on_close=True)``) run here in a scope the close cancels.
    So the native server runs no cancel scope per generating request.

    It answers in two parts (``StartingApplication``): :meth:`start` checks the key,
    routes and calls the handler, all at once; only what the handler leaves (a
    coroutine) is awaited.  A stream (chat, completions, messages, responses, generate)
    leaves nothing: its jobs are submitted and the engine's sink ends the response, so
    no task runs for it.
    """

    ends_on_close = True

    def __init__(self, ctx: ApiContext, router: Router) -> None:
        self.ctx = ctx
        self.router = router

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        """:meth:`start`, the rest it leaves, then the end of the response (or its close)."""
        watched = _EndWatch(response)
        rest = self.start(request, watched)
        if rest is not None:
            await rest
        await watched.ended_or_closed()

    def start(self, request: HttpRequest, response: ResponseStream) -> Awaitable[None] | None:
        clear_request_adapter()  # (this context may be the reader's, which served a request before)
        keys = self.ctx.control.api_key  # --api-key: checked before routing, as vLLM's middleware
        if keys and not authorized(request, keys):
            send_unauthorized(response)
            return None
        try:
            resolved = self.router.resolve_request(request)
        except ApiError as error:  # 404 / 405: in the envelope of the path's family
            self._send_error(response, error, self.router.error_style_for(request.path))
            return None
        call = Call(self.ctx, request, response, resolved.params)
        rest: Awaitable[None] | None
        try:
            if resolved.cancel_on_close:
                rest = _cancelled_on_close(resolved.handler, call)
            else:
                rest = resolved.handler(call)
                if rest is None:
                    return None
        except Exception as error:
            self._handler_raised(error, request, response, resolved.error_style)
            return None
        return self._rest(rest, request, response, resolved.error_style)

    async def _rest(self, rest: Awaitable[None], request: HttpRequest, response: ResponseStream, style: str) -> None:
        try:
            await rest
        except Exception as error:
            self._handler_raised(error, request, response, style)

    def _handler_raised(self, error: Exception, request: HttpRequest, response: ResponseStream, style: str) -> None:
        """Answer what a handler raised (in its ``except`` block), or raise it again."""
        if isinstance(error, ResponseClosed):
            return  # the client is gone: nothing to answer
        if isinstance(error, ApiError):
            self._send_error(response, error, style)
            return
        if response.started:
            # The head is on its way: only the protocol layer can tell the client that
            # this body is cut short (RST_STREAM, or a close mid-body), which it does for
            # a handler that raises.  Ending the body here would make it look complete.
            raise error
        log.exception("unexpected error answering %s %s", request.method, request.path)
        self._send_error(response, ApiError(500, "Internal server error"), style)

    @staticmethod
    def _send_error(response: ResponseStream, error: ApiError, style: str) -> None:
        if response.closed or response.ended:
            return
        if response.started:
            response.end()
            return
        body = error.anthropic_body() if style == ErrorStyle.ANTHROPIC else error.body()
        headers = (*JSON_HEADERS, *error.headers, (b"content-length", str(len(body)).encode()))
        response.start(error.status, headers)
        response.end(body)


class _EndWatch(ResponseWrapper):
    """A response that tells when it ended or closed, for :meth:`Api.handle` (whose
    stream the engine may end after the handler returned).  Only ``end`` and
    ``on_close`` pass through it (see :class:`ResponseWrapper`): not a token's write.

    ``handle`` cancelled while it waits counts as the client's leaving: the close
    callbacks registered through it run then (the stream's sink stops, its jobs are
    cancelled), as they would at the close."""

    def __init__(self, inner: ResponseStream) -> None:
        super().__init__(inner)
        self._over = trio.Event()
        self._close_callbacks: list[Callable[[], None]] = []
        inner.on_close(self._over.set)

    def on_close(self, callback: Callable[[], None]) -> None:
        self._close_callbacks.append(callback)
        self._inner.on_close(callback)

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        try:
            self._inner.end(data, trailers)
        finally:
            self._over.set()

    async def ended_or_closed(self) -> None:
        # (Held no longer than this wait: a sink's callback points back at this response.)
        callbacks, self._close_callbacks = self._close_callbacks, []
        if self.ended or self.closed:
            return
        try:
            await self._over.wait()
        except BaseException:
            for callback in callbacks:
                callback()
            raise


async def _cancelled_on_close(handler: Handler, call: Call) -> None:
    """Run ``handler`` in a cancel scope that its response's close cancels."""
    with trio.CancelScope() as scope:
        call.response.on_close(scope.cancel)
        rest = handler(call)
        if rest is not None:
            await rest
