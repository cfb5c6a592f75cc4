"""The tool-call generation knobs, llm-d-inference-sim's flags with its defaults.

They steer what :mod:`llmsim.model.tools` plans (how many calls) and what
:mod:`llmsim.schema.jsonschema` generates (optional properties, number ranges,
array lengths); explicit schema bounds always win over them.
"""

from __future__ import annotations

import attrs

__all__ = ["ToolCallOptions"]


def _percent(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 100:
        raise ValueError(f"{attribute.name.replace('_', '-')} must be a percentage in 0..100, got {value}")


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name.replace('_', '-')} must be >= 0, got {value}")


@attrs.frozen(kw_only=True)
class ToolCallOptions:
    """llm-d-inference-sim's tool-call knobs; field names are its flag names with ``_``."""

    min_tool_call_integer_param: int = 0
    max_tool_call_integer_param: int = 100
    min_tool_call_number_param: float = 0.0
    max_tool_call_number_param: float = 100.0
    min_tool_call_array_param_length: int = attrs.field(default=1, validator=_non_negative)
    max_tool_call_array_param_length: int = attrs.field(default=5, validator=_non_negative)
    tool_call_not_required_param_probability: int = attrs.field(default=50, validator=_percent)
    object_tool_call_not_required_field_probability: int = attrs.field(default=50, validator=_percent)
    tool_call_extra_call_probability: int = attrs.field(default=45, validator=_percent)

    def __attrs_post_init__(self) -> None:
        for kind in ("integer_param", "number_param", "array_param_length"):
            low, high = getattr(self, f"min_tool_call_{kind}"), getattr(self, f"max_tool_call_{kind}")
            if low > high:
                name = kind.replace("_", "-")
                raise ValueError(f"min-tool-call-{name} ({low}) must not exceed max-tool-call-{name} ({high})")
