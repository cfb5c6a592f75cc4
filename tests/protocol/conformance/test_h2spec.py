"""h2spec's cases against both backends: a fresh connection per case, to one server per
backend shared by all cases (see ``servers.py``).

A backend's known failures (``outcomes.XFAIL``) are strict xfails, so the suite stays
green and a fix shows up as an XPASS, to be removed from the list.  The error codes a
backend sends where h2spec expects others but lets them pass (``outcomes.OTHER_CODES``)
are checked exactly, both ways.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from llmsim.config import Config
from llmsim.server import ServerHandle
from tests.conftest import BACKENDS
from tests.protocol.conformance.case import Case
from tests.protocol.conformance.catalogue import CASES
from tests.protocol.conformance.outcomes import OTHER_CODES, XFAIL
from tests.protocol.conformance.servers import background_servers
from tests.protocol.conformance.wire import Peer

PATH = "/v1/models"  # a GET with a body of more than 5 octets, as h2spec's flow-control cases need
# 100 concurrent streams rather than 1000, so that 5.1.2 opens 101 streams, not 1001
SERVER = {"port": 0, "max_concurrent_streams": 100}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerHandle]]:
    with background_servers({backend: Config(**SERVER, server=backend) for backend in BACKENDS}) as handles:
        yield handles


def _param(case: Case, backend: str) -> object:
    reason = XFAIL[backend].get(case.id)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case, backend, id=f"{case.id}-{backend}", marks=marks)


@pytest.mark.parametrize(("case", "backend"), [_param(case, backend) for case in CASES for backend in BACKENDS])
async def test_h2spec_case(case: Case, backend: str, servers: dict[str, ServerHandle]) -> None:
    server = servers[backend]
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        peer = Peer(stream, authority=f"{server.host}:{server.port}", path=PATH)
        await case.run(peer)
    other_codes = ", ".join(peer.other_codes) or None
    assert other_codes == OTHER_CODES[backend].get(case.id), "the error codes h2spec let pass (outcomes.OTHER_CODES)"
