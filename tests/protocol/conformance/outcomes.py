"""How each backend falls short of h2spec, case by case; docs/conformance.md is generated
from this file and the case list (``python -m tests.protocol.conformance.table``).

``XFAIL``: the cases a backend fails, with what it does instead.  The tests mark them
``xfail(strict=True)`` for that backend only, so a fix fails the suite until its line
here is removed.

``OTHER_CODES``: the cases a backend passes only through h2spec's leniency, with the
frames it sends: h2spec expects a GOAWAY (or RST_STREAM) with one error code, reads on
when the code differs, and passes once the connection closes.
"""

from __future__ import annotations

XFAIL: dict[str, dict[str, str]] = {
    "native": {},
    "hypercorn": {},
}

# Both backends speak HTTP/2 through the h2 library, which reports HPACK decoding errors and a SETTINGS
# ACK with a payload as PROTOCOL_ERROR.
_H2_CODES = {
    "http2/4.3/1": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "http2/6.5/1": "GOAWAY PROTOCOL_ERROR (FRAME_SIZE_ERROR expected)",
    "hpack/2.3.3/1": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "hpack/2.3.3/2": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "hpack/4.2/1": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "hpack/5.2/1": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "hpack/5.2/2": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "hpack/5.2/3": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "hpack/6.1/1": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
    "hpack/6.3/1": "GOAWAY PROTOCOL_ERROR (COMPRESSION_ERROR expected)",
}

OTHER_CODES: dict[str, dict[str, str]] = {
    "native": dict(_H2_CODES),
    "hypercorn": dict(_H2_CODES),
}
