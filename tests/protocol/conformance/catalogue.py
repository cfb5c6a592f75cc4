"""Every h2spec case, in h2spec's order (``generic``, ``http2``, ``hpack``; sections in tree order)."""

from __future__ import annotations

from tests.protocol.conformance import http2_frames, http2_messages  # noqa: F401  (they register their cases)
from tests.protocol.conformance.case import Case
from tests.protocol.conformance.generic_hpack import GENERIC, HPACK
from tests.protocol.conformance.http2_streams import HTTP2

SPECS = ("generic", "http2", "hpack")


def _order(case: Case) -> tuple[int, tuple[int, ...], int]:
    spec, section, number = case.id.split("/")
    return SPECS.index(spec), tuple(int(part) for part in section.split(".")), int(number)


CASES: tuple[Case, ...] = tuple(sorted((*GENERIC.cases, *HTTP2.cases, *HPACK.cases), key=_order))
