"""One gRPC call's response: a :class:`~llmsim.api.http.ResponseStream` over the HTTP/2
stream that always ends with status trailers.

The generation flow (:func:`llmsim.api.generation.stream`) writes to it as to any
response: its ``start`` becomes gRPC's head (``content-type: application/grpc``, whatever
the flow asked for), its ``end`` adds ``grpc-status`` (OK, or the error the renderer
recorded with :meth:`GrpcResponse.set_status`).  :meth:`GrpcResponse.finish` ends a call
from outside the flow: a refusal before any message is HEADERS then the trailers, with
no DATA; a deadline or a failure mid-stream ends the messages already sent with that
status.
"""

from __future__ import annotations

from llmsim.api.grpc.wire import GRPC_HEADERS, StatusCode, status_trailers
from llmsim.api.http import Headers, ResponseStream, ResponseWrapper

__all__ = ["GrpcResponse"]


class GrpcResponse(ResponseWrapper):
    """The gRPC view of ``response`` (see the module docstring)."""

    def __init__(self, response: ResponseStream) -> None:
        super().__init__(response)
        self._code = StatusCode.OK
        self._message = ""

    def set_status(self, code: StatusCode, message: str) -> None:
        """The status the call ends with, unless it has ended already."""
        self._code, self._message = code, message

    def start(self, status: int, headers: Headers) -> None:
        """gRPC's head: ``:status`` 200 whatever the outcome (the status is a trailer)."""
        self._inner.start(200, GRPC_HEADERS)

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        self._inner.end(data, (*status_trailers(self._code, self._message), *trailers))

    def finish(self, code: StatusCode, message: str = "") -> None:
        """End the call now with ``code``: after the messages sent so far, or as the
        whole answer (HEADERS, then the trailers).  Nothing happens once it ended."""
        if self.ended:
            return
        self.set_status(code, message)
        if not self.started:
            self.start(200, ())
        self.end()
