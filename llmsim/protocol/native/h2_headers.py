"""The server's h2 connection, and the header blocks it receives and sends.

:class:`ServerConnection` is h2 4.x's ``H2Connection`` with three costs of every request
taken out, nothing on the wire changed:

* h2 formats ``repr(frame)`` for a trace log on every received frame, even though its
  logger discards it (a few percent of the server's CPU time).
* h2 validates every inbound header block through a chain of eight generators (about a
  third of h2's cost of a request head).  Here h2's validation is switched off, and
  :func:`_check_header_block` runs right after h2 has otherwise handled the HEADERS
  frame, where h2 would have validated: an ordinary request head is checked in one
  pass (:func:`_plain_request`), and every other block (trailers, cookies, a ``host``
  or ``te`` field, CONNECT, anything unusual or malformed) goes through h2's own
  pipeline, which raises exactly what it always raised, so h2 answers with the same
  GOAWAY.
* h2 counts the open streams on each new stream (see :attr:`open_inbound_streams`).

``tests/protocol/test_http2_header_validation.py`` feeds random header blocks to this
connection and to a stock h2 one and requires identical events, errors and bytes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import h2.config
import h2.connection
import h2.events
from h2.errors import ErrorCodes
from h2.exceptions import StreamClosedError, StreamIDTooLowError
from h2.settings import SettingCodes, Settings
from h2.utilities import CONNECTION_HEADERS, HeaderValidationFlags, normalize_inbound_headers, validate_headers
from hpack.struct import Header
from hyperframe.frame import Frame, HeadersFrame, RstStreamFrame

from llmsim.api.http import HttpRequest
from llmsim.protocol.native.stream import split_target

__all__ = ["ServerConnection", "request_head", "response_headers", "server_connection"]

# Inbound header blocks are validated by _check_header_block; outbound ones are ours,
# lower-cased and filtered by response_headers, so h2 need not check them again.
_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
)
#: What h2 is told the stream limit is: the handler enforces the advertised one itself.
_UNLIMITED_STREAMS = 2**31 - 1
_HEADER_EVENTS = (
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
_COLON = ord(":")
#: Values are checked joined by 0x01 with 0x01 around: whitespace next to a 0x01 is at a
#: value's edge, and NUL, CR and LF become 0x02.  (A value holding 0x01 or 0x02 may
#: look bad and take h2's path; a bad one never looks good.)
_VALUE_MARKS = bytes.maketrans(b"\t\x00\r\n", b" \x02\x02\x02")
#: Regular field names already found plain (bounded; only ever a speed-up).
_known_names: set[bytes] = set()


class ServerConnection(h2.connection.H2Connection):
    """h2's server connection, with the per-request costs above made cheap."""

    _next_walk = 64

    @property
    def open_inbound_streams(self) -> int:
        """h2 counts the open inbound streams on each HEADERS that opens one, walking
        every stream it holds (and forgetting the closed ones as it goes): O(streams)
        per request, about 0.15 ms at 500 streams on one connection.  llmsim lifts h2's
        limit and refuses with REFUSED_STREAM by its own count (see
        :func:`server_connection`), so the number is never compared with anything that
        matters.  Here the walk runs only once the table has doubled since the last one,
        so closed streams are still forgotten (at most about as many linger as are open,
        plus 64), in amortized O(1); in between, the table size is returned, an upper
        bound of the true count."""
        if len(self.streams) < self._next_walk:
            return len(self.streams)
        count = super().open_inbound_streams
        self._next_walk = max(64, 2 * len(self.streams))
        return count

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        """h2 4.x's own, less ``logger.trace("Received frame: %s", repr(frame))``."""
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except StreamClosedError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except StreamIDTooLowError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events

    def _receive_headers_frame(self, frame: HeadersFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        """h2's own, then the header block check h2 would have made inside it."""
        frames, events = super()._receive_headers_frame(frame)
        _check_header_block(events)
        return frames, events


def server_connection(settings_limit: int, max_header_bytes: int, upgrade_settings: bytes | None) -> ServerConnection:
    """A server connection whose first SETTINGS advertise ``settings_limit`` streams.

    h2 treats a HEADERS frame beyond MAX_CONCURRENT_STREAMS as a *connection* error.
    RFC 9113 section 5.1.2 wants a stream error (REFUSED_STREAM), so once the SETTINGS
    frame is serialized h2's own limit is lifted and the handler refuses.

    Raises ``ValueError`` or h2's ``ProtocolError`` if ``upgrade_settings`` (the
    client's ``HTTP2-Settings`` header) cannot be decoded.
    """
    conn = ServerConnection(config=_CONFIG)

    def local_settings(limit: int) -> Settings:
        return Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: limit,
                SettingCodes.MAX_HEADER_LIST_SIZE: max_header_bytes,
            },
        )

    conn.local_settings = local_settings(settings_limit)
    if upgrade_settings is None:
        conn.initiate_connection()
    else:
        conn.initiate_upgrade_connection(upgrade_settings)
    conn.local_settings = local_settings(_UNLIMITED_STREAMS)
    return conn


# --- inbound ---------------------------------------------------------------------------


def _check_header_block(events: list[h2.events.Event]) -> None:
    """Validate and normalize the header block h2 has just attached to its event, as
    h2's ``H2Stream._process_received_headers`` would have (raising h2's
    ``ProtocolError`` for a malformed block, which h2 answers with GOAWAY).

    The first event is the stream's headers event: h2 lists the connection's events
    first, and there are none for HEADERS on an open connection.  (PUSH_PROMISE, the
    other header block h2 validates, a server refuses before decoding it.)
    """
    event = events[0]
    assert isinstance(event, _HEADER_EVENTS)
    headers = event.headers
    if type(event) is h2.events.RequestReceived and _plain_request(headers):
        return  # h2 would have accepted it unchanged
    flags = HeaderValidationFlags(
        is_client=False,
        is_trailer=isinstance(event, h2.events.TrailersReceived),
        is_response_header=not isinstance(event, (h2.events.RequestReceived, h2.events.TrailersReceived)),
        is_push_promise=False,
    )
    event.headers = list(validate_headers(normalize_inbound_headers(headers, flags), flags))


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
