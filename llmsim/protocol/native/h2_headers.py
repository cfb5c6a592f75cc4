"""The header blocks of HTTP/2 requests and responses, as llmsim's types.

:func:`request_head` turns a header block h2 has received (and
:mod:`.h2_fastpath` validated) into an :class:`~llmsim.api.http.HttpRequest`
(:func:`with_body` adds the body once it is complete);
:func:`response_headers` turns a response head into HTTP/2 header fields.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.api.http import HttpRequest
from llmsim.protocol.native.stream import split_target

__all__ = ["request_head", "response_headers", "with_body"]

_COLON = ord(":")


def request_head(headers: Sequence[tuple[bytes, bytes]], default_scheme: str) -> HttpRequest:
    """The request a validated header block asks for; ``:authority`` becomes ``host``
    when there is none."""
    pseudo: dict[bytes, bytes] = {}
    regular: list[tuple[bytes, bytes]] = []
    has_host = False
    for name, value in headers:
        if name[0] == _COLON:  # validated: names are never empty
            pseudo[name] = value
        else:
            regular.append((name, value))
            has_host = has_host or name == b"host"
    authority = pseudo.get(b":authority")
    if authority is not None and not has_host:
        regular.append((b"host", authority))
    path, query = split_target(pseudo.get(b":path", b"/"))
    scheme = pseudo.get(b":scheme")
    return HttpRequest(
        method=pseudo.get(b":method", b"GET").decode("ascii", "replace"),
        path=path,
        query=query,
        headers=tuple(regular),
        http_version="2",
        scheme=default_scheme if scheme is None else scheme.decode("ascii", "replace"),
    )


def with_body(head: HttpRequest, body: bytes, received_at: float | None = None) -> HttpRequest:
    """``head`` (from :func:`request_head`) with its ``body``, and the time its HEADERS
    arrived: what ``attrs.evolve`` makes, without its per-field lookups by name
    (``tests/protocol/native/test_h2_inbound.py`` checks that no field is lost)."""
    h = head
    return HttpRequest(h.method, h.path, h.query, h.headers, body, h.http_version, h.scheme, received_at)


# --- outbound --------------------------------------------------------------------------

#: Connection-specific headers that must not appear in HTTP/2 (RFC 9113 section 8.2.2).
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


def response_headers(status: int, headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The response head as HTTP/2 header fields: ``:status`` first, names lower-cased,
    connection-specific fields dropped."""
    result = [(b":status", b"%d" % status)]
    for name, value in headers:
        name = name.lower()
        if name not in _HOP_BY_HOP:
            result.append((name, value))
    return result
