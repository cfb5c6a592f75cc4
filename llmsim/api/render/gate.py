"""vLLM's gate on its scale-out endpoints (render, generate).

vLLM 0.33 serves ``/v1/*/render`` and ``/inference/v1/generate`` only with
``--enable-scale-out`` (or ``--tokens-only``, or ``vllm launch render``); otherwise each
of their routes answers 403 ``PermissionDeniedError`` whatever the body
(vllm/entrypoints/scale_out/factories.py:87-131).  llm-d-inference-sim serves them always,
and so does llmsim by default (``--enable-scale-out``, on); ``--no-enable-scale-out``
gives vLLM's 403.
"""

from __future__ import annotations

from llmsim.api.context import ApiContext
from llmsim.api.errors import ApiError

__all__ = ["SCALE_OUT_DISABLED", "require_scale_out"]

SCALE_OUT_DISABLED = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."


def require_scale_out(ctx: ApiContext) -> None:
    """403 unless the scale-out endpoints are on (factories.py:100-109: no param)."""
    if not ctx.model.enable_scale_out:
        raise ApiError(403, SCALE_OUT_DISABLED, error_type="PermissionDeniedError")
