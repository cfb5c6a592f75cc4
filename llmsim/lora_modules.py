"""``--lora-modules`` entries: vLLM's two forms, read into :class:`LoraModule`.

vLLM's ``LoRAParserAction`` (``vllm/entrypoints/common/cli_args.py:38-69``): an entry
with ``=`` and no ``,`` is ``name=path``; anything else is a JSON object with the fields
of ``LoRAModulePath`` (``vllm/entrypoints/openai/models/protocol.py:15-19``): ``name``,
``path``, optional ``base_model_name`` and ``is_3d_lora_weight``.  llm-d-inference-sim
takes the JSON form only, so both of its spellings are read the same way here.
"""

from __future__ import annotations

import json

import attrs

__all__ = ["LoraModule", "parse_lora_module"]

_OPTIONAL = {"base_model_name": str, "is_3d_lora_weight": bool}


@attrs.frozen
class LoraModule:
    """One adapter served from start-up."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoraModule:
    """Read one ``--lora-modules`` entry.

    Raises:
        ValueError: with vLLM's wording (``Invalid JSON format``, ``Invalid fields``).
    """
    if "=" in text and "," not in text:
        name, path = text.split("=", 1)
        if not name:
            raise ValueError(f"Invalid fields for --lora-modules: {text} - the name is empty")
        return LoraModule(name, path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"Invalid JSON format for --lora-modules: {text}") from None
    if not isinstance(value, dict):
        raise ValueError(f"Invalid fields for --lora-modules: {text} - expected a JSON object")
    unknown = sorted(set(value) - {"name", "path", *_OPTIONAL})
    missing = [key for key in ("name", "path") if not isinstance(value.get(key), str) or not value[key]]
    if unknown or missing:
        problem = f"unexpected field {unknown[0]!r}" if unknown else f"{missing[0]!r} must be a non-empty string"
        raise ValueError(f"Invalid fields for --lora-modules: {text} - {problem}")
    for key, kind in _OPTIONAL.items():
        if key in value and value[key] is not None and not isinstance(value[key], kind):
            raise ValueError(f"Invalid fields for --lora-modules: {text} - {key!r} must be a {kind.__name__}")
    return LoraModule(value["name"], value["path"], value.get("base_model_name"))
