"""The basic endpoint family."""

from llmsim.api.basic.routes import register

__all__ = ["register"]
