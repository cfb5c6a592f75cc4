"""Inbound header blocks, validated as h2 would validate them (h2's own validation is
off in the server's configuration, :mod:`.h2_fastpath`): an ordinary request head in
one pass (:func:`_plain_request`), every other block through h2's own pipeline, which
raises exactly what it always raised.
"""

from __future__ import annotations

import re

import h2.events
from h2.utilities import (
    CONNECTION_HEADERS,
    HeaderValidationFlags,
    normalize_inbound_headers,
    validate_headers,
)
from hpack.struct import Header

__all__ = ["HEADER_EVENTS", "check_header_block"]

HEADER_EVENTS = (
    h2.events.RequestReceived,
    h2.events.TrailersReceived,
    h2.events.ResponseReceived,
    h2.events.InformationalResponseReceived,
)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
#: Fields h2 rejects, rewrites or checks against others: their blocks take h2's path.
_SPECIAL_NAMES = CONNECTION_HEADERS | {b"te", b"cookie", b"host"}
#: A regular field name h2 accepts: no colon, no upper case, nothing outside 0x21-0x7e.
_PLAIN_NAME = re.compile(rb"[\x21-\x39\x3b-\x40\x5b-\x7e]+")
_MAX_KNOWN_NAMES = 512
#: Values are checked joined by 0x01 with 0x01 around: whitespace next to a 0x01 is at a
#: value's edge, and NUL, CR and LF become 0x02.  (A value holding 0x01 or 0x02 may
#: look bad and take h2's path; a bad one never looks good.)
_VALUE_MARKS = bytes.maketrans(b"\t\x00\r\n", b" \x02\x02\x02")
#: Regular field names already found plain (bounded; only ever a speed-up).
_known_names: set[bytes] = set()


def check_header_block(events: list[h2.events.Event]) -> bool:
    """Validate and normalize the header block h2 has just attached to its event, as
    h2's ``H2Stream._process_received_headers`` would have (raising h2's
    ``ProtocolError`` for a malformed block, which h2 answers with GOAWAY).  True if
    it is an ordinary request head (:func:`_plain_request`), left as it is.

    The first event is the stream's headers event: h2 lists the connection's events
    first, and there are none for HEADERS on an open connection.  (PUSH_PROMISE, the
    other header block h2 validates, a server refuses before decoding it.)
    """
    event = events[0]
    assert isinstance(event, HEADER_EVENTS)
    headers = event.headers
    assert headers is not None  # h2 has just set it
    if type(event) is h2.events.RequestReceived and _plain_request(headers):
        return True  # h2 would have accepted it unchanged
    flags = HeaderValidationFlags(
        is_client=False,
        is_trailer=isinstance(event, h2.events.TrailersReceived),
        is_response_header=not isinstance(event, (h2.events.RequestReceived, h2.events.TrailersReceived)),
        is_push_promise=False,
    )
    event.headers = list(validate_headers(normalize_inbound_headers(headers, flags), flags))
    return False


def _plain_request(headers: list[Header]) -> bool:
    """Whether ``headers`` is a request head h2 accepts and leaves as it is: first the
    four request pseudo-headers, each once (:path not empty, :method not CONNECT), then
    regular fields with plain names (no cookie, host, te or connection-specific field),
    and no value with NUL, CR, LF or whitespace at either end.  False says nothing: h2
    decides then."""
    pseudo = dict(headers[:4])
    if pseudo.keys() != _REQUEST_PSEUDO or not pseudo[b":path"] or pseudo[b":method"] == b"CONNECT":
        return False
    return _plain_names([header[0] for header in headers[4:]]) and _plain_values([header[1] for header in headers])


def _plain_names(names: list[bytes]) -> bool:
    """Whether every regular field name is plain: one set lookup for the names a client
    sends on every request, the regex only for new ones."""
    if _known_names.issuperset(names):
        return True
    for name in names:
        if name in _SPECIAL_NAMES or _PLAIN_NAME.fullmatch(name) is None:
            return False
    if len(_known_names) < _MAX_KNOWN_NAMES:
        _known_names.update(names)
    return True


def _plain_values(values: list[bytes]) -> bool:
    """Whether no value holds NUL, CR or LF or starts or ends with whitespace, in a few
    C-level passes over all of them (see ``_VALUE_MARKS``)."""
    marked = b"\x01".join([b"", *values, b""]).translate(_VALUE_MARKS)
    return b"\x02" not in marked and b"\x01 " not in marked and b" \x01" not in marked
