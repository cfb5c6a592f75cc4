"""llmsim: a vLLM-compatible LLM inference simulator on trio.

Embedded use::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(llmsim.serve, llmsim.Config(port=0))
        ...  # server.url, server.port, server.statistics()
        nursery.cancel_scope.cancel()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmsim._version import __version__

__all__ = ["Config", "ConfigError", "ServerHandle", "ServerStatistics", "__version__", "serve"]

if TYPE_CHECKING:
    from llmsim.config import Config, ConfigError
    from llmsim.server import ServerHandle, ServerStatistics, serve

_LAZY = {
    "Config": "llmsim.config",
    "ConfigError": "llmsim.config",
    "ServerHandle": "llmsim.server",
    "ServerStatistics": "llmsim.server",
    "serve": "llmsim.server",
}


def __getattr__(name: str) -> Any:
    """Import the public names on first use, so ``import llmsim.config`` stays light."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'llmsim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
