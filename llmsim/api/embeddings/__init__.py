"""The embeddings endpoint family (POST /v1/embeddings)."""

from llmsim.api.embeddings.routes import register

__all__ = ["register"]
