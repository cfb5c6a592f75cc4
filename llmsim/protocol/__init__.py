"""Connection handlers: HTTP/1.1 (h11) and HTTP/2 (h2) on trio, and the ASGI adapter.

Imports nothing from ``llmsim.engine``; talks to the API only through
:mod:`llmsim.api.http` (``HttpRequest`` / ``ResponseStream`` / ``Application``).
"""

from __future__ import annotations

from llmsim.protocol.connection import Connection
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings, ServerHandle, ServerStatistics

__all__ = ["Connection", "ConnectionTracker", "ProtocolSettings", "ServerHandle", "ServerStatistics"]
