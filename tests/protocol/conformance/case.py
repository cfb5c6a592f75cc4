"""One h2spec case: its id (``http2/6.5.3/1``: spec, section, number within the section),
h2spec's description, and the exchange, run against a fresh connection."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs

from tests.protocol.conformance.wire import Peer

Run = Callable[[Peer], Awaitable[None]]


@attrs.frozen
class Case:
    id: str
    description: str
    run: Run
    strict: bool = False  # run by h2spec only with --strict


@attrs.define
class Catalogue:
    """The cases of one h2spec spec (``generic``, ``http2``, ``hpack``), numbered as h2spec
    numbers them: in the order they are defined within each section."""

    spec: str
    cases: list[Case] = attrs.field(factory=list)

    def case(self, section: str, description: str, *, strict: bool = False) -> Callable[[Run], Run]:
        def register(run: Run) -> Run:
            prefix = f"{self.spec}/{section}/"
            number = 1 + sum(1 for case in self.cases if case.id.startswith(prefix))
            self.cases.append(Case(f"{prefix}{number}", description, run, strict))
            return run

        return register
