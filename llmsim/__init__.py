"""llmsim: a vLLM-compatible LLM inference simulator on trio.

Embedded use::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(llmsim.serve, llmsim.Config(port=0))
        ...  # server.url, server.port, server.statistics()
        nursery.cancel_scope.cancel()
"""

from __future__ import annotations

__version__ = "0.1.0"

from llmsim.config import Config, ConfigError  # noqa: E402
from llmsim.server import ServerHandle, ServerStatistics, serve  # noqa: E402

__all__ = ["Config", "ConfigError", "ServerHandle", "ServerStatistics", "serve", "__version__"]
