"""The tokenize endpoint family: POST /tokenize and POST /detokenize."""

from llmsim.api.tokenize.routes import register

__all__ = ["register"]
