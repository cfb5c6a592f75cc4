"""The token-in/token-out endpoint family: POST /inference/v1/generate."""

from llmsim.api.generate.routes import register

__all__ = ["register"]
