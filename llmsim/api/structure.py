"""Strict JSON -> attrs structuring of request bodies, with errors that name the field.

cattrs does the walking; the hooks registered here make it strict the way a JSON API
must be: an integer field takes an integer (not ``"5"``, not ``true``), a list field
takes a JSON array (not a string it could iterate), an object field takes a JSON
object.  Unknown keys are ignored (vLLM ignores many sampling fields).  Every failure
becomes an :class:`~llmsim.api.errors.ApiError` 400 whose ``param`` is the path of the
offending field, e.g. ``messages[0].content``.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, IterableValidationError, IterableValidationNote
from cattrs.gen import make_dict_structure_fn

from llmsim.api.errors import ApiError

__all__ = ["FieldTypeError", "converter", "json_type_name", "structure"]

T = TypeVar("T")


class FieldTypeError(TypeError):
    """A JSON value of the wrong type; the message says what was expected."""

    def __init__(self, expected: str, value: object) -> None:
        super().__init__(f"expected {expected}, got {json_type_name(value)}")


def json_type_name(value: object) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _structure_int(value: object, _: type) -> int:
    if isinstance(value, bool):
        raise FieldTypeError("an integer", value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise FieldTypeError("an integer", value)


def _structure_float(value: object, _: type) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise FieldTypeError("a number", value)


def _structure_str(value: object, _: type) -> str:
    if isinstance(value, str):
        return value
    raise FieldTypeError("a string", value)


def _structure_bool(value: object, _: type) -> bool:
    if isinstance(value, bool):
        return value
    raise FieldTypeError("a boolean", value)


def _structure_any(value: object, _: type) -> object:
    return value


def _is_homogeneous_tuple(type_: Any) -> bool:
    args = typing.get_args(type_)
    return typing.get_origin(type_) is tuple and len(args) == 2 and args[1] is Ellipsis


def _tuple_hook_factory(type_: Any) -> Callable[[object, type], tuple[Any, ...]]:
    """JSON array -> tuple, element by element, with the index in any error.  The
    element hook is looked up once, here, not once per array."""
    element_type = typing.get_args(type_)[0]
    hook = converter.get_structure_hook(element_type)

    def structure_tuple(value: object, _: type) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise FieldTypeError("an array", value)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(hook(item, element_type))
            except Exception as exc:
                exc.add_note(IterableValidationNote(f"Structuring {type_} @ index {index}", index, element_type))
                raise IterableValidationError(f"While structuring {type_!r}", [exc], type_) from None
        return tuple(items)

    return structure_tuple


def _is_optional(type_: Any) -> bool:
    """``X | None`` (cattrs's own test for the optional types it handles)."""
    args = typing.get_args(type_)
    return typing.get_origin(type_) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args


def _optional_hook_factory(type_: Any) -> Callable[[object, type], Any]:
    """``X | None``: None, or an ``X``.  cattrs's default looks the hook of ``X`` up on
    every call; this one is looked up once, here (an optional field is on every request)."""
    inner_type = next(arg for arg in typing.get_args(type_) if arg is not type(None))
    hook = converter.get_structure_hook(inner_type)

    def structure_optional(value: object, _: type) -> Any:
        return None if value is None else hook(value, inner_type)

    return structure_optional


def _attrs_hook_factory(cls: type) -> Callable[[object, type], Any]:
    """JSON object -> attrs instance; anything else is a type error, not a crash."""
    structure_fields: cattrs.SimpleStructureHook[Mapping[str, Any], Any] = make_dict_structure_fn(cls, converter)

    def structure_object(value: object, type_: type) -> Any:
        if not isinstance(value, dict):
            raise FieldTypeError("an object", value)
        return structure_fields(value, type_)

    return structure_object


converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
converter.register_structure_hook(int, _structure_int)
converter.register_structure_hook(float, _structure_float)
converter.register_structure_hook(str, _structure_str)
converter.register_structure_hook(bool, _structure_bool)
converter.register_structure_hook(Any, _structure_any)
converter.register_structure_hook_factory(_is_homogeneous_tuple, _tuple_hook_factory)
converter.register_structure_hook_factory(_is_optional, _optional_hook_factory)
converter.register_structure_hook_factory(attrs.has, _attrs_hook_factory)


def structure(value: object, cls: type[T]) -> T:
    """``value`` (decoded JSON) as a ``cls``, or an ApiError 400 naming the bad field."""
    try:
        return converter.structure(value, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        raise _as_api_error(exc) from None


def _as_api_error(exc: BaseException) -> ApiError:
    path, leaf = _first_failure(exc)
    where = "".join(path).lstrip(".")
    if isinstance(leaf, KeyError):
        return ApiError(400, f"Field '{where}' is required.", param=where or None)
    if isinstance(leaf, FieldTypeError):
        target = f"'{where}'" if where else "the request body"
        return ApiError(400, f"Invalid type for {target}: {leaf}.", param=where or None)
    return ApiError(400, f"Invalid value for '{where}': {leaf}", param=where or None)


def _first_failure(exc: BaseException) -> tuple[list[str], BaseException]:
    """Follow the first sub-exception down to the leaf, collecting the field path."""
    path: list[str] = []
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
        for note in getattr(exc, "__notes__", ()):
            if isinstance(note, AttributeValidationNote):
                path.append(f".{note.name}")
            elif isinstance(note, IterableValidationNote):
                path.append(f"[{note.index}]")
    return path, exc
