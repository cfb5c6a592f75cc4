"""The LoRA adapters a simulated server serves, as vLLM's ``OpenAIServingModels`` keeps them.

Adapters come from ``--lora-modules`` at start-up and from ``POST /v1/load_lora_adapter``
at run time.  No weights exist: an adapter is a name, a path (``root`` in /v1/models)
and the base model it belongs to (``parent``).  The checks and messages are vLLM's
(``vllm/entrypoints/openai/models/serving.py:159-300``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attrs

from llmsim.api.errors import ApiError
from llmsim.lora_modules import LoraModule

__all__ = ["LoraAdapter", "LoraRegistry"]

log = logging.getLogger("llmsim.api")

_INVALID = "InvalidUserInput"


@attrs.frozen
class LoraAdapter:
    """One served adapter: its model card's ``id``, ``root`` and ``parent``."""

    name: str
    path: str
    parent: str


class LoraRegistry:
    """The served adapters, by name, in load order.

    ``enabled`` is whether the server runs with LoRA (``--enable-lora`` or
    ``--lora-modules``); a runtime load turns it on too, since llmsim serves the load
    endpoint whatever the flags (as llm-d-inference-sim does).
    """

    def __init__(self, base_names: tuple[str, ...], modules: Iterable[LoraModule], *, enabled: bool) -> None:
        self._base_names = base_names
        self.enabled = enabled
        self.adapters: dict[str, LoraAdapter] = {}
        for module in modules:  # vLLM's init_static_loras (serving.py:126-141)
            self.load(module.name, module.path, base_model_name=module.base_model_name)

    def get(self, name: str) -> LoraAdapter | None:
        return self.adapters.get(name)

    def load(self, name: str, path: str, *, load_inplace: bool = False, base_model_name: str | None = None) -> str:
        """Serve ``name`` from now on; vLLM's success text.

        Raises:
            ApiError: 400 for an empty name or path, a base model's name, or an adapter
                loaded already without ``load_inplace`` (serving.py:249-283).
        """
        if not name or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", error_type=_INVALID)
        if name in self._base_names:
            raise ApiError(400, f"The lora adapter '{name}' conflicts with a served base model.", error_type=_INVALID)
        if not load_inplace and name in self.adapters:
            raise ApiError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True.",
                error_type=_INVALID,
            )
        # parent: the named base model if it is served, else the first (serving.py:148-157,196-197)
        parent = base_model_name if base_model_name in self._base_names else self._base_names[0]
        self.adapters[name] = LoraAdapter(name, path, parent)
        self.enabled = True
        log.info("Loaded new LoRA adapter: name '%s', path '%s'", name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: str) -> str:
        """Stop serving ``name``; vLLM's success text.  Requests already running with
        it run to their end, as in vLLM (the engine keeps the adapter they hold).

        Raises:
            ApiError: 400 for an empty name, 404 for one not loaded (serving.py:285-300).
        """
        if not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", error_type=_INVALID)
        if name not in self.adapters:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", error_type="NotFoundError")
        del self.adapters[name]
        log.info("Removed LoRA adapter: name '%s'", name)
        return f"Success: LoRA adapter '{name}' removed successfully."
