"""``--api-key`` / ``VLLM_API_KEY``: vLLM's AuthenticationMiddleware, in front of routing.

vLLM 0.33 installs it when any key is set (``vllm/entrypoints/serve/middleware/
register.py:32-36``) and it checks, for every method but OPTIONS, every path that starts
with ``/v1``, ``/v2``, ``/inference`` or ``/cohere`` (a plain string prefix: ``/v1foo``
too; the path percent-decoded, as ASGI gives it); everything else (``/health``,
``/ping``, ``/version``, ``/metrics``, ``/admin/config``, ``/sleep`` ...) stays open.
The request needs ``Authorization: <scheme> <token>`` with the scheme ``bearer`` in any
case and the token one of the keys, compared as SHA-256 digests in constant time
(``vllm/entrypoints/serve/middleware/authenticate.py:10-63``).  Otherwise the answer is
401 ``{"error":"Unauthorized"}``, without the usual error envelope and without
``WWW-Authenticate``.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from urllib.parse import unquote

from llmsim.api.errors import JSON_HEADERS
from llmsim.api.http import HttpRequest, ResponseStream

__all__ = ["GUARDED_PREFIXES", "UNAUTHORIZED_BODY", "authorized", "send_unauthorized"]

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
# starlette's JSONResponse({"error": "Unauthorized"}, status_code=401): compact JSON
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'
_UNAUTHORIZED_HEADERS = (*JSON_HEADERS, (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()))


def authorized(request: HttpRequest, keys: tuple[str, ...]) -> bool:
    """Whether vLLM lets ``request`` through when the server's keys are ``keys``.
    ``keys`` comes from ``ctx.control`` as the request arrives (it is never cached here)."""
    digests = _digests(keys)
    if not digests or request.method == "OPTIONS":
        return True
    path = unquote(request.path) if "%" in request.path else request.path
    if not path.startswith(GUARDED_PREFIXES):
        return True
    return _verify_token(request.header("authorization"), digests)


def send_unauthorized(response: ResponseStream) -> None:
    response.start(401, _UNAUTHORIZED_HEADERS)
    response.end(UNAUTHORIZED_BODY)


def _verify_token(header: str | None, digests: tuple[bytes, ...]) -> bool:
    """authenticate.py:31-46: every digest is compared, so that the time taken does not
    tell which key (if any) came close."""
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # starlette reads the header as latin-1 and vLLM hashes the token as UTF-8: a key with
    # non-ASCII characters matches only when the client sends it in latin-1, there and here.
    digest = hashlib.sha256(token.encode("utf-8")).digest()
    match = False
    for expected in digests:
        match |= secrets.compare_digest(digest, expected)
    return match


@functools.lru_cache(maxsize=8)
def _digests(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    """The keys' SHA-256 digests; empty keys are dropped, as vLLM does (register.py:33)."""
    return tuple(hashlib.sha256(key.encode("utf-8")).digest() for key in keys if key)
