"""Response headers that say who answered: llm-d's pod headers and the worker's index.

llm-d-inference-sim adds ``x-inference-pod`` and ``x-inference-port`` when ``POD_NAME``
is set and ``x-inference-namespace`` when ``POD_NAMESPACE`` is
(``pkg/communication/http.go:209-217``; Kubernetes sets both from the downward API,
deploy/); llmsim adds them to every response.  A ``--workers`` worker also adds
``x-llmsim-worker: <index>``.  Without any of them the application is served as is.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmsim.api.http import Application, Headers, HttpRequest, ResponseStream, ResponseWrapper

__all__ = ["WORKER_HEADER", "answer_headers", "with_headers"]

WORKER_HEADER = b"x-llmsim-worker"


def answer_headers(environ: Mapping[str, str], port: int, worker: int | None = None) -> Headers:
    """The headers every response carries, for this environment, port and worker."""
    headers: list[tuple[bytes, bytes]] = []
    pod, namespace = environ.get("POD_NAME"), environ.get("POD_NAMESPACE")
    if pod:
        headers += [(b"x-inference-pod", pod.encode("latin-1")), (b"x-inference-port", str(port).encode())]
    if namespace:
        headers.append((b"x-inference-namespace", namespace.encode("latin-1")))
    if worker is not None:
        headers.append((WORKER_HEADER, str(worker).encode()))
    return tuple(headers)


def with_headers(app: Application, headers: Headers) -> Application:
    """``app``, adding ``headers`` to every response it starts (``app`` itself if none)."""
    return _HeadersAdded(app, headers) if headers else app


class _HeadersAdded:
    def __init__(self, app: Application, headers: Headers) -> None:
        self._app = app
        self._headers = tuple(headers)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        await self._app.handle(request, _Response(response, self._headers))


class _Response(ResponseWrapper):
    """``inner`` with extra headers at :meth:`start`; every other call is ``inner``'s."""

    def __init__(self, inner: ResponseStream, headers: Headers) -> None:
        super().__init__(inner)
        self._headers = headers

    def start(self, status: int, headers: Headers) -> None:
        self._inner.start(status, (*headers, *self._headers))
