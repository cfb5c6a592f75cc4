"""The compiled per-token path: whether it is on, and the switch that turns it off.

``llmsim._speedups`` (C, ``native/*.c``, built by ``pip install`` where a C compiler
is; optional, see ``setup.py``) holds compiled twins of the functions every paced
token goes through: the engine's step loop, the streaming sink's token case, the
HTTP/2 and HTTP/1.1 writes, the connection's wake-up and the flush after a step.  Each
layer installs its own twin when its module is imported (with the function
:func:`installer` finds), and the pure-Python function stays the reference: the C code
does what it does, for the cases it takes, and hands every other case to it.  docs/performance.md ("Issue 16, fourth
pass: the compiled per-token path") says why and what it saves.

``LLMSIM_PURE=1`` in the environment (read once, at import) keeps the pure path only;
the test suite runs the twins against each other (tests/test_speedups.py and each
twin's differential tests).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["NATIVE", "PURE_ENVIRONMENT_VARIABLE", "installer"]

#: Set to anything but ``""`` or ``"0"``: run without the compiled twins.
PURE_ENVIRONMENT_VARIABLE = "LLMSIM_PURE"


def _load() -> ModuleType | None:
    if os.environ.get(PURE_ENVIRONMENT_VARIABLE, "") not in ("", "0"):
        return None
    try:
        # by name: ``from llmsim import _speedups`` would import the whole package first
        return importlib.import_module("llmsim._speedups")
    except ImportError:  # not built (no C compiler where it was installed): the pure path
        return None


#: The compiled module, or None: the pure path only.
NATIVE = _load()


def installer(name: str) -> Callable[..., Any] | None:
    """The compiled module's function ``name`` (``install_...``), or None: no compiled
    path, or a module built before that twin was written (an in-place build not redone
    after a pull): then the pure function stays, and the twin's tests say so, loudly."""
    function: Callable[..., Any] | None = getattr(NATIVE, name, None)
    return function
