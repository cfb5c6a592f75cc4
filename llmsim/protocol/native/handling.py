"""Running an application's handler for one response, on either path of
:func:`~.stream.run_handler` (plain, or through :mod:`.faulty`): a handler that raises,
or returns without ending its response, gets a 500 (or, once its head is decided, an
abort on the wire) and a line in the log."""

from __future__ import annotations

import logging
from typing import Protocol

from llmsim.api.http import Application, HttpRequest, ResponseStream

__all__ = ["FailableResponse", "fail_if_unended", "handle_or_fail", "handler_failed"]

log = logging.getLogger("llmsim.protocol")


class FailableResponse(ResponseStream, Protocol):
    def fail(self, message: str) -> None:
        """The handler failed: a 500 with ``message`` if nothing was started, else an abort."""


async def handle_or_fail(app: Application, request: HttpRequest, response: FailableResponse) -> bool:
    """``app.handle(request, response)``; False (and ``response`` failed) if it raised."""
    try:
        await app.handle(request, response)
    except Exception:
        handler_failed(request, response)
        return False
    return True


def handler_failed(request: HttpRequest, response: FailableResponse) -> None:
    """The handler raised (call it in the ``except`` block): log it, fail ``response``."""
    log.exception("handler for %s %s failed", request.method, request.path)
    response.fail("the server failed while answering this request; see the server log")


def fail_if_unended(request: HttpRequest, response: FailableResponse) -> None:
    """A handler that returned must have ended (or lost) its response."""
    if not response.state.ended and not response.state.closed:
        log.error("handler for %s %s returned without ending its response", request.method, request.path)
        response.fail("the server returned without completing this response; see the server log")
