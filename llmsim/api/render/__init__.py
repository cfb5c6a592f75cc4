"""The render endpoint family: a request's prompt as token ids, no generation."""

from llmsim.api.render.routes import register

__all__ = ["register"]
