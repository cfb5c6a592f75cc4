"""``GET /metrics``: vLLM's Prometheus metrics, from the engine's own statistics."""

from llmsim.api.metrics.routes import register

__all__ = ["register"]
