"""The compiled per-token path: whether it is on, and the switch that turns it off.

``llmsim._speedups`` (C, ``native/*.c``, built by ``pip install`` where a C compiler
is; optional, see ``setup.py``) holds compiled twins of the functions every paced
token goes through: the engine's step loop, the streaming sink's token case, and the
HTTP/2 stream's write.  Each layer installs its own twin when its module is imported
(``if NATIVE is not None: ...``), and the pure-Python function stays the reference:
the C code does what it does, for the cases it takes, and hands every other case to
it.  docs/performance.md ("The compiled per-token path") says why and what it saves.

``LLMSIM_PURE=1`` in the environment (read once, at import) keeps the pure path only;
the test suite runs the twins against each other (tests/test_speedups.py).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["NATIVE", "PURE_ENVIRONMENT_VARIABLE"]

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
