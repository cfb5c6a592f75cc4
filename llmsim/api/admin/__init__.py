"""The control plane: live configuration (``/admin/config``) and vLLM's sleep mode."""

from llmsim.api.admin.control import AdminControl
from llmsim.api.admin.routes import register
from llmsim.api.admin.sleep import SleepState

__all__ = ["AdminControl", "SleepState", "register"]
