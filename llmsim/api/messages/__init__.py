"""The messages endpoint family."""

from llmsim.api.messages.routes import register

__all__ = ["register"]
