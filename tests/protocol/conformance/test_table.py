"""docs/conformance.md shows what the case list and outcomes.py say (see ``table.py``)."""

from __future__ import annotations

from tests.protocol.conformance.table import DOC, render


def test_docs_table_is_current() -> None:
    document = DOC.read_text()
    assert document == render(document), "run: python -m tests.protocol.conformance.table"
