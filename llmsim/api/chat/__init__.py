"""The chat endpoint family."""

from llmsim.api.chat.routes import register

__all__ = ["register"]
