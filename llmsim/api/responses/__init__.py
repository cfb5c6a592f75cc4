"""The responses endpoint family."""

from llmsim.api.responses.routes import register

__all__ = ["register"]
