"""HTTP/1.1 without h11's event machinery, where that provably changes nothing.

The common request -- ``HTTP/1.1``, keep-alive, one ``Host``, a ``Content-Length``
body (or none) that came whole in one read -- and the common response to it -- a
streamed body, so chunked -- are parsed and written here.  h11 costs about 60
function calls and a dozen event objects for such a request; this is one regular
expression over the head and one cached head per distinct (status, headers).

What this module accepts is a subset of what h11 accepts, and it yields what h11
yields: :func:`parse_whole_request` uses h11's own grammar (``h11/_abnf.py``, copied
below), so a head it parses is one h11 parses into the same method, target and
headers; anything unusual (another HTTP version, ``Connection: close``,
``Transfer-Encoding``, ``Expect``, ``Upgrade``, several ``Host`` or
``Content-Length`` fields, a ``Content-Length`` with commas, HEAD or CONNECT, a head
over the size limit, a body not all there) is declined (None) and goes to h11 as
before.  :func:`chunked_head` writes what h11's ``send(Response(...))`` writes for a
keep-alive HTTP/1.1 request when the response has no framing headers of its own:
the status line, the fields in order, ``Transfer-Encoding: chunked``; any head it is
not sure of (``Content-Length``, ``Connection``, ``Host``, 1xx/204/304, a field h11
would refuse) is declined, and h11 is then brought up to date with the request
(``Http1Handler._catch_up``) and writes the head itself.
``tests/protocol/native/test_http1_fastpath.py`` checks both against h11.
"""

from __future__ import annotations

import re
from typing import TypeAlias

from llmsim.api.http import HttpRequest, reason_phrase
from llmsim.protocol.native.stream import split_target

__all__ = ["SIZE_LINES", "WholeRequest", "chunked_head", "parse_whole_request"]

# h11/_abnf.py (h11 0.16): token, field-value (its fixed-up field-content), request-line.
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_FIELD_VCHAR = rb"[^\x00\s]"
_FIELD_VALUE = rb"(?:%s+(?:[ \t]+%s+)*)?" % (_FIELD_VCHAR, _FIELD_VCHAR)
_FIELD = rb"%s:[ \t]*%s[ \t]*\r\n"  # header-field = field-name ":" OWS field-value OWS
#: A whole head: request line (HTTP/1.1 only), header lines, the empty line.  With no
#: CR or LF inside a line, the first blank line h11 finds (``\n\r?\n``) is this one.
_HEAD = re.compile(rb"(%s) ([\x21-\x7e]+) HTTP/1\.1\r\n((?:%s)*)\r\n" % (_TOKEN, _FIELD % (_TOKEN, _FIELD_VALUE)))
_FIELDS = re.compile(_FIELD % (b"(" + _TOKEN + b")", b"(" + _FIELD_VALUE + b")"))
_NAME = re.compile(_TOKEN)
_VALUE = re.compile(_FIELD_VALUE)
_LENGTH = re.compile(rb"[0-9]{1,20}")  # h11: CONTENT_LENGTH_MAX_DIGITS = 20
#: Request fields that make h11 do more than parse: declined, except a Host (exactly
#: one), a plain Content-Length (one) and a Connection without "close".
_SPECIAL = frozenset((b"host", b"content-length", b"connection", b"transfer-encoding", b"expect", b"upgrade"))
#: Response fields h11 rewrites or acts on (framing, keep-alive, Host written first).
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection", b"host"))
_DECLINED_METHODS = (b"HEAD", b"CONNECT")  # framed differently by h11

WholeRequest: TypeAlias = tuple[HttpRequest, int]

#: What a head parses into: method, path, query, the fields (names lower-cased) and
#: the body's length; None if it is declined.
_Head: TypeAlias = tuple[str, str, str, tuple[tuple[bytes, bytes], ...], int] | None
_parsed: dict[bytes, _Head] = {}
_UNSEEN: _Head = ("", "", "", (), -1)  # (a marker: not in _parsed)
_MAX_REMEMBERED_HEAD = 2048  # bytes: longer heads are parsed every time
_MAX_HEADS = 256  # distinct heads remembered, requests (_parsed) and responses (_heads)


def parse_whole_request(
    data: bytes, scheme: str, max_head: int, max_body: int, received_at: float | None = None
) -> WholeRequest | None:
    """The request at the start of ``data`` (read at ``received_at``) and where it ends,
    if it is all there and ordinary (see the module docstring); None to leave it to h11."""
    end = data.find(b"\r\n\r\n")
    if end < 0 or end > max_head:  # (no need to match what will be declined)
        return None
    start = end + 4
    # A client sends the same head again and again (a load generator: every time): what
    # it parses into is remembered by its bytes, and the regular expressions, the
    # lower-casing and the checks of the fields run once per distinct head.
    head = data[:start]
    parsed = _parsed.get(head, _UNSEEN)
    if parsed is _UNSEEN:
        parsed = _parse_head(head)
        if start <= _MAX_REMEMBERED_HEAD:
            if len(_parsed) >= _MAX_HEADS:
                _parsed.clear()
            _parsed[head] = parsed
    if parsed is None:
        return None
    method, path, query, headers, length = parsed
    stop = start + length
    # The head's size as Http1Handler measures it (its 431 limit) is at most start +
    # len(headers): declined near the limit, h11's path decides there.
    if length > max_body or stop > len(data) or start + len(headers) > max_head:
        return None
    request = HttpRequest(
        method=method,
        path=path,
        query=query,
        headers=headers,
        body=data[start:stop],
        http_version="1.1",
        scheme=scheme,
        received_at=received_at,
    )
    return request, stop


def _parse_head(head: bytes) -> _Head:
    """:func:`parse_whole_request`'s work on a whole ``head`` (up to its empty line)."""
    match = _HEAD.fullmatch(head)
    if match is None:
        return None
    method, target, block = match.groups()
    if method in _DECLINED_METHODS:
        return None
    headers = tuple([(name.lower(), value) for name, value in _FIELDS.findall(block)])
    length = _body_length(headers)
    if length is None:
        return None
    path, query = split_target(target)
    return method.decode("ascii"), path, query, headers, length


def _body_length(headers: tuple[tuple[bytes, bytes], ...]) -> int | None:
    """The Content-Length (0 without one) if the special fields are ordinary, else None."""
    hosts = 0
    length: bytes | None = None
    for name, value in headers:
        if name not in _SPECIAL:
            continue
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            if length is not None or _LENGTH.fullmatch(value) is None:
                return None
            length = value
        elif name != b"connection" or b"close" in [token.strip() for token in value.lower().split(b",")]:
            return None
    if hosts != 1:
        return None
    return 0 if length is None else int(length)


_heads: dict[tuple[int, tuple[tuple[bytes, bytes], ...]], bytes] = {}  # (x-request-id echoes make many)


def chunked_head(status: int, headers: tuple[tuple[bytes, bytes], ...]) -> bytes | None:
    """The response head h11 writes for a chunked response to a keep-alive HTTP/1.1
    request (not HEAD, not CONNECT); None if h11 would write another or refuse it."""
    key = (status, headers)
    head = _heads.get(key)
    if head is None:
        head = _render_head(status, headers)
        if head is None:
            return None
        if len(_heads) >= _MAX_HEADS:
            _heads.clear()
        _heads[key] = head
    return head


def _render_head(status: int, headers: tuple[tuple[bytes, bytes], ...]) -> bytes | None:
    # h11: a Response is 200..999; 204 and 304 have no body (Content-Length: 0 framing).
    if type(status) is not int or not 200 <= status < 1000 or status in (204, 304):
        return None
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason_phrase(status))]
    for name, value in headers:
        if _NAME.fullmatch(name) is None or _VALUE.fullmatch(value) is None or name.lower() in _FRAMING:
            return None
        lines.append(b"%s: %s\r\n" % (name, value))
    lines.append(b"Transfer-Encoding: chunked\r\n\r\n")  # h11's set_comma_header: title case, last
    return b"".join(lines)


#: The chunk-size lines (``b"e6\r\n"``) of chunks up to 4 KiB, the sizes of stream
#: writes: :func:`.frames.chunk`'s framing for a token is ``SIZE_LINES[len(data)]``,
#: ``data``, ``b"\r\n"`` joined, without formatting the size each time.
SIZE_LINES = tuple(b"%x\r\n" % size for size in range(4096))
