"""vLLM's gRPC service, ``vllm.grpc.engine.VllmEngine`` (smg-grpc-proto's
``vllm_engine.proto``), on the HTTP port: every ``POST`` with ``content-type:
application/grpc*`` comes here (:meth:`~llmsim.api.router.Router.add_content_type`),
and its path names the method, ``/vllm.grpc.engine.VllmEngine/Generate``.

A call runs as any request does: in the backend's task, cancelled when the client
resets the stream (grpcio's cancel is RST_STREAM), which cancels its jobs and frees
their slots.  ``grpc-timeout`` bounds it: past the deadline the call ends with
DEADLINE_EXCEEDED (and its jobs are cancelled the same way).  Errors end the call with
a status (:func:`~llmsim.api.grpc.wire.status_for_http` for the HTTP errors the shared
checks raise); a method this service lacks, or another service, is UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio
from google.protobuf.message import DecodeError
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import ApiError
from llmsim.api.grpc import health, info
from llmsim.api.grpc.generate import GenerateCall
from llmsim.api.grpc.response import GrpcResponse
from llmsim.api.grpc.wire import GrpcError, StatusCode, frame, parse_timeout, status_for_http, unframe
from llmsim.api.router import Router

__all__ = ["SERVICE", "GrpcService", "register"]

log = logging.getLogger("llmsim.api")

SERVICE = "vllm.grpc.engine.VllmEngine"
Unary = Callable[[ApiContext, Any], Any]
Method = Callable[[Call, GrpcResponse], Awaitable[None]]

# The methods answered at once with one message, by path: (request message class, answer).
# (Health's Watch streams: here it sends the current status and ends, as smg's does.)
_UNARY: dict[str, tuple[Any, Unary]] = {
    f"/{SERVICE}/HealthCheck": (pb.HealthCheckRequest, info.health_check),
    f"/{SERVICE}/GetModelInfo": (pb.GetModelInfoRequest, info.get_model_info),
    f"/{SERVICE}/GetServerInfo": (pb.GetServerInfoRequest, info.get_server_info),
    f"/{SERVICE}/GetLoads": (pb.GetLoadsRequest, info.get_loads),
    f"/{SERVICE}/Embed": (pb.EmbedRequest, info.embed),
    f"/{health.HEALTH_SERVICE}/Check": (health.HealthCheckRequest, health.check),
    f"/{health.HEALTH_SERVICE}/Watch": (health.HealthCheckRequest, health.watch),
}


def _request_message(body: bytes, message_class: Any) -> Any:
    """The one request message of a unary-request call."""
    messages = list(unframe(body))
    if len(messages) != 1:
        raise GrpcError(StatusCode.INTERNAL, f"expected one request message, got {len(messages)}")
    try:
        return message_class.FromString(messages[0])
    except DecodeError:
        raise GrpcError(StatusCode.INTERNAL, "Exception deserializing request!") from None


class GrpcService:
    """The services of one simulator: the method table, and the Generate calls running
    by request id (for ``Abort``)."""

    def __init__(self) -> None:
        self._running: dict[str, list[trio.CancelScope]] = {}
        self._methods: dict[str, Method] = {
            f"/{SERVICE}/Generate": self._generate,
            f"/{SERVICE}/Abort": self._abort,
            **{path: _unary_method(*unary) for path, unary in _UNARY.items()},
        }

    async def handle(self, call: Call) -> None:
        """Answer one gRPC call, whatever happens, with a status."""
        response = GrpcResponse(call.response)
        path = call.request.path
        method = self._methods.get(path)
        if method is None:
            response.finish(StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
            return
        try:
            timeout = _timeout(call)
        except ValueError as exc:
            response.finish(StatusCode.INTERNAL, str(exc))
            return
        with trio.move_on_after(timeout) as deadline:
            await _answer(method, call, response)
        if deadline.cancelled_caught:
            response.finish(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    async def _generate(self, call: Call, response: GrpcResponse) -> None:
        request = _request_message(call.request.body, pb.GenerateRequest)
        generation = GenerateCall(call, response, request)
        with self._tracked(request.request_id) as scope:
            await generation.run()
        if scope.cancelled_caught:
            generation.abort()

    @contextmanager
    def _tracked(self, request_id: str) -> Iterator[trio.CancelScope]:
        """A scope that ``Abort`` of ``request_id`` cancels (none for a call without an id)."""
        scope = trio.CancelScope()
        scopes = self._running.setdefault(request_id, []) if request_id else []
        scopes.append(scope)
        try:
            with scope:
                yield scope
        finally:
            scopes.remove(scope)
            if request_id and not scopes:
                del self._running[request_id]

    async def _abort(self, call: Call, response: GrpcResponse) -> None:
        """vLLM's out-of-band abort (servicer.py:788-815): every running Generate call
        with one of these ids ends with ``finish_reason "abort"``; unknown ids are ignored."""
        request = _request_message(call.request.body, pb.AbortRequest)
        for request_id in request.request_ids:
            for scope in self._running.get(request_id, ()):
                scope.cancel()
        response.start(200, ())
        response.end(frame(pb.AbortResponse().SerializeToString()))


def _unary_method(message_class: Any, answer: Unary) -> Method:
    async def method(call: Call, response: GrpcResponse) -> None:
        reply = answer(call.ctx, _request_message(call.request.body, message_class))
        response.start(200, ())
        response.end(frame(reply.SerializeToString()))

    return method


def _timeout(call: Call) -> float:
    value = call.request.header("grpc-timeout")
    return float("inf") if value is None else parse_timeout(value)


async def _answer(method: Method, call: Call, response: GrpcResponse) -> None:
    """Run ``method``; its errors end the call with their status."""
    try:
        await method(call, response)
    except GrpcError as error:
        response.finish(error.code, error.message)
    except ApiError as error:
        response.finish(status_for_http(error.status), error.message)
    except Exception:  # the status says the call failed, after whatever messages were sent
        log.exception("unexpected error answering gRPC %s", call.request.path)
        response.finish(StatusCode.INTERNAL, "Internal server error")


def register(router: Router) -> None:
    router.add_content_type("application/grpc", GrpcService().handle, cancel_on_close=True)  # its own waits
