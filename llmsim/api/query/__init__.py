"""The Mooncake bootstrap endpoint family (``GET /query``)."""

from llmsim.api.query.routes import register

__all__ = ["register"]
