"""Every protocol test also checks that no connection died of an unexpected exception
(``Connection.run`` logs those rather than crash the server, so they would go unseen)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_crashed_connections(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    crashes = [r for r in records if r.name == "llmsim.protocol" and r.msg.startswith("connection handler failed")]
    assert not crashes, crashes[0].exc_text
