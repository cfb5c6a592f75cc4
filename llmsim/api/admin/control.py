"""What ``/admin/config`` asks of the simulator: read the live configuration, change part of it.

The API layer may not read configuration values itself (the lenient reading of ``"100ms"``
or ``"rate_limit server_error"`` lives in :mod:`llmsim.config`, above it), so the handlers
talk to this protocol; :class:`llmsim.admin.LiveConfig` implements it and
:class:`llmsim.app.Simulator` hands it to the context as ``ctx.admin``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

__all__ = ["AdminControl"]


class AdminControl(Protocol):
    """The live configuration, as llm-d-inference-sim's ``/admin/config`` shows and changes it."""

    def snapshot(self) -> dict[str, object]:
        """Every setting under its kebab-case key, as JSON values (durations as Go writes
        them, ``"100ms"``); secrets are masked."""

    def update(self, values: Mapping[str, object]) -> dict[str, object]:
        """Apply ``values``, a partial mapping of admin-configurable keys, all or nothing,
        and return the new :meth:`snapshot`.

        Raises ValueError, whose text is what the client is told, with nothing changed.
        Synchronous on purpose: nothing else runs between the checks and the change, so
        two updates never interleave.
        """
