"""The completions endpoint family."""

from llmsim.api.completions.routes import register

__all__ = ["register"]
