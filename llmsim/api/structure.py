"""JSON -> attrs structuring of request bodies as vLLM's pydantic models read them, with
errors that name the field.

cattrs does the walking; the hooks registered here read scalars as pydantic 2's lax mode
does (vLLM's request models are pydantic): an integer field takes ``5``, ``5.0``,
``"5"``, ``" 5 "``, ``"1_000"`` or ``true``; a number field takes a numeric string; a
boolean field takes ``0``/``1`` and ``"yes"``/``"off"``/``"t"``...; a string field takes
only a string.  A list field takes a JSON array (not a string it could iterate), an
object field takes a JSON object.  Unknown keys are ignored (vLLM ignores many sampling
fields).  Every failure
becomes an :class:`~llmsim.api.errors.ApiError` 400 as vLLM renders FastAPI's
``RequestValidationError``: type ``Bad Request``, ``param`` the field's location, e.g.
``body.messages.0.content``, and pydantic's error for it (:func:`request_validation_error`).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, IterableValidationError, IterableValidationNote
from cattrs.gen import make_dict_structure_fn

from llmsim.api.errors import ApiError

__all__ = [
    "FieldErrors",
    "FieldTypeError",
    "PydanticError",
    "converter",
    "error_input",
    "json_type_name",
    "pydantic_type_error",
    "read_bodies_fast",
    "request_validation_error",
    "structure",
    "validation_errors",
]

T = TypeVar("T")


class FieldTypeError(TypeError):
    """A JSON value of the wrong type; the message says what was expected."""

    def __init__(self, expected: str, value: object) -> None:
        super().__init__(f"expected {expected}, got {json_type_name(value)}")
        self.expected = expected
        self.value = value


@attrs.frozen
class PydanticError:
    """One error as pydantic reports it, for a value at ``loc`` below the field that
    failed (a union branch's own markers left out, as vLLM cleans them)."""

    type: str
    msg: str
    input: object
    loc: tuple[str | int, ...] = ()
    ctx: dict[str, object] | None = None


class FieldErrors(ValueError):
    """A field's value refused with pydantic's own errors (one or more, e.g. one per
    branch of a union), reported as they are."""

    def __init__(self, *errors: PydanticError) -> None:
        super().__init__("; ".join(error.msg for error in errors))
        self.errors = errors


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


#: A string pydantic's lax mode reads as an integer: digits with ``_`` between them, an
#: optional sign, surrounding blanks, and a fraction of zeros (``" 5 "``, ``"1_000"``, ``"5.0"``).
_INTEGER_TEXT = re.compile(r"\s*([+-]?[0-9](?:_?[0-9])*)(?:\.0*)?\s*")
#: The strings pydantic's lax mode reads as booleans (case-insensitive).
_TRUE_TEXTS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_TEXTS = frozenset({"0", "off", "f", "false", "n", "no"})


def _structure_int(value: object, _: type) -> int:
    if isinstance(value, int):  # bool included: pydantic's lax mode reads true as 1
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        match = _INTEGER_TEXT.fullmatch(value)
        if match is not None:
            try:
                return int(match.group(1).replace("_", ""))
            except ValueError:  # beyond Python's int-from-text digit limit (pydantic: int_parsing_size)
                pass
    raise FieldTypeError("an integer", value)


def _structure_float(value: object, _: type) -> float:
    if isinstance(value, int | float):  # bool included, as in pydantic's lax mode
        return float(value)
    if isinstance(value, str) and value.strip():
        try:
            return float(value)  # Python's float() reads what pydantic does: "1e3", " 2.5 ", "1_0", "inf"
        except ValueError:
            pass
    raise FieldTypeError("a number", value)


def _structure_str(value: object, _: type) -> str:
    if isinstance(value, str):
        return value
    raise FieldTypeError("a string", value)


def _structure_bool(value: object, _: type) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.lower()
        if text in _TRUE_TEXTS or text in _FALSE_TEXTS:
            return text in _TRUE_TEXTS
    raise FieldTypeError("a boolean", value)


def _structure_any(value: object, _: type) -> object:
    return value


def _structure_object(value: object, _: type) -> dict[str, Any]:
    """``dict[str, Any]``: any JSON object, taken as it is (pydantic's ``dict_type`` otherwise)."""
    if isinstance(value, dict):
        return value
    raise FieldTypeError("an object", value)


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
converter.register_structure_hook_func(lambda t: t == dict[str, Any], _structure_object)
converter.register_structure_hook_factory(_is_homogeneous_tuple, _tuple_hook_factory)
converter.register_structure_hook_factory(_is_optional, _optional_hook_factory)
converter.register_structure_hook_factory(attrs.has, _attrs_hook_factory)


def structure(value: object, cls: type[T]) -> T:
    """``value`` (decoded JSON) as a ``cls``, or an ApiError 400 naming the bad field."""
    reader = _BODY_READERS.get(cls)
    if reader is not None and type(value) is dict:
        read: T | None = reader(value)
        if read is not None:
            return read
    try:
        return converter.structure(value, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        raise _as_api_error(exc, value) from None


#: The request classes :func:`structure` reads with :func:`_body_reader` (:func:`read_bodies_fast`).
_BODY_READERS: dict[type, Callable[[dict[str, Any]], Any]] = {}
_REQUIRED = object()  # a required field's placeholder in a reader's defaults


def read_bodies_fast(cls: type[T]) -> type[T]:
    """Class decorator: :func:`structure` reads a body as ``cls`` with :func:`_body_reader`
    first.  For a request class (one per request, ~40 fields of which a body sets a
    few): cattrs's generated function tests every field's key and then calls the
    class's ``__init__`` with every value as a keyword.  ``cls`` must be a frozen dict
    class (``slots=False``) without validators, converters, factories, aliases or
    ``__attrs_post_init__``: its ``__init__`` only stores the values."""
    plain = "__slots__" not in cls.__dict__ and not hasattr(cls, "__attrs_post_init__")
    for field in attrs.fields(cls):  # type: ignore[arg-type]  # an attrs class: checked by attrs.fields
        plain = plain and field.validator is None and field.converter is None and field.alias == field.name
        plain = plain and not isinstance(field.default, attrs.Factory)  # type: ignore[arg-type]
    if not plain:
        raise TypeError(f"{cls.__name__} is not a frozen dict class of plain fields")

    def first(body: dict[str, Any]) -> T | None:
        # built on first use: the field types' hooks are registered by then (as cattrs's own)
        reader = _BODY_READERS[cls] = _body_reader(cls)
        return reader(body)

    _BODY_READERS[cls] = first
    return cls


def _body_reader(cls: type[T]) -> Callable[[dict[str, Any]], T | None]:
    """A reader of a JSON object as ``cls`` that returns what cattrs's generated
    function does, for less: only the body's keys are visited (unknown ones ignored,
    each value through the hook cattrs calls for its field), and the instance gets a
    copy of the defaults updated with them as its ``__dict__``, what the class's
    ``__init__`` would store (see :func:`read_bodies_fast`).  None when a hook raises or
    a required key is missing: then cattrs runs again, for its error with the field's
    path."""
    fields = attrs.fields(cls)  # type: ignore[arg-type]  # see read_bodies_fast
    types = typing.get_type_hints(cls)
    hooks = {field.name: (converter.get_structure_hook(types[field.name]), types[field.name]) for field in fields}
    defaults = {field.name: _REQUIRED if field.default is attrs.NOTHING else field.default for field in fields}
    required = tuple(field.name for field in fields if field.default is attrs.NOTHING)
    new = object.__new__
    set_dict = object.__setattr__

    def read(body: dict[str, Any]) -> T | None:
        values = defaults.copy()
        try:
            for key, item in body.items():
                hook = hooks.get(key)
                if hook is not None:
                    values[key] = hook[0](item, hook[1])
        except Exception:
            return None
        for name in required:
            if values[name] is _REQUIRED:
                return None
        instance: T = new(cls)
        set_dict(instance, "__dict__", values)
        return instance

    return read


#: pydantic's error ``type`` and ``msg`` for a value of the wrong JSON type, by what the
#: field expects (pydantic-core's messages; vLLM's request models are pydantic).
_PYDANTIC_TYPE_ERRORS = {
    "an integer": ("int_type", "Input should be a valid integer"),
    "a number": ("float_type", "Input should be a valid number"),
    "a string": ("string_type", "Input should be a valid string"),
    "a boolean": ("bool_type", "Input should be a valid boolean"),
    "an array": ("list_type", "Input should be a valid list"),
    "an object": ("dict_type", "Input should be a valid dictionary"),
}


def pydantic_type_error(expected: str, value: object) -> tuple[str, str] | None:
    """What pydantic says of ``value`` where ``expected`` is wanted (lax mode parses strings)."""
    if isinstance(value, str):
        if expected == "an integer":
            return "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
        if expected == "a number":
            return "float_parsing", "Input should be a valid number, unable to parse string as a number"
        if expected == "a boolean":
            return "bool_parsing", "Input should be a valid boolean, unable to interpret input"
    if expected == "an integer" and isinstance(value, float):
        return "int_from_float", "Input should be a valid integer, got a number with a fractional part"
    if expected == "a boolean" and isinstance(value, int) and not isinstance(value, bool):
        return "bool_parsing", "Input should be a valid boolean, unable to interpret input"
    return _PYDANTIC_TYPE_ERRORS.get(expected)


def error_input(value: object) -> object:
    """vLLM's size-bounded stand-in for an error's ``input``
    (vllm/entrypoints/serve/exception_handling/handlers/validation.py:83-104)."""
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "...[truncated]"
    if isinstance(value, list | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "...[truncated]"


def request_validation_error(errors: list[object], param: str | None = None) -> ApiError:
    """FastAPI's ``RequestValidationError`` as vLLM renders it: 400, type ``Bad Request``,
    ``param`` the first error's ``loc``, and ``"N validation error(s):"`` then each error
    as its Python ``str`` (vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196)."""
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "\n".join(f"  {error}" for error in errors)
    return ApiError(400, message, param=param, error_type="Bad Request")


def _as_api_error(exc: BaseException, value: object) -> ApiError:
    errors = validation_errors(exc, value)
    if errors is None:
        # a union of types: pydantic lists one error per branch; llmsim says what it expects
        path, leaf = _first_failure(exc)
        message = f"Invalid type for '{_dotted(path) or 'the request body'}': {leaf}."
        return ApiError(400, message, param=_loc(path), error_type="Bad Request")
    first = errors[0]
    return request_validation_error(list(errors), str(first["loc"]))


def validation_errors(exc: BaseException, value: object) -> list[dict[str, object]] | None:
    """pydantic's errors (as vLLM prints them) for a failure of :func:`structure`'s
    converter on ``value``; None for a value of none of a union's types, which llmsim
    words itself.  (A union of request classes lists each branch's errors.)"""
    path, leaf = _first_failure(exc)
    loc = ".".join(["body", *map(str, path)])
    if isinstance(leaf, KeyError):
        parent = _value_at(value, path[:-1])
        return [{"type": "missing", "loc": loc, "msg": "Field required", "input": error_input(parent)}]
    if isinstance(leaf, FieldErrors):
        return [_error_dict(error, [*path, *error.loc]) for error in leaf.errors]
    if isinstance(leaf, FieldTypeError):
        known = pydantic_type_error(leaf.expected, leaf.value)
        if known is None:
            return None
        kind, msg = known
        return [{"type": kind, "loc": loc, "msg": msg, "input": error_input(leaf.value)}]
    # a validator's ValueError, as pydantic wraps it
    text = str(leaf)
    return [
        {
            "type": "value_error",
            "loc": loc,
            "msg": f"Value error, {text}",
            "input": error_input(_value_at(value, path)),
            "ctx": {"error": ValueError(text)},
        }
    ]


def _loc(path: list[str | int]) -> str:
    return ".".join(["body", *map(str, path)])


def _error_dict(error: PydanticError, path: list[str | int]) -> dict[str, object]:
    """``error`` as vLLM prints it: its ``loc`` dotted, its ``input`` bounded."""
    fields: dict[str, object] = {"type": error.type, "loc": _loc(path), "msg": error.msg}
    fields["input"] = error_input(error.input)
    if error.ctx is not None:
        fields["ctx"] = error.ctx
    return fields


def _dotted(path: list[str | int]) -> str:
    return "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path).lstrip(".")


def _value_at(value: object, path: list[str | int]) -> object:
    for key in path:
        if isinstance(value, dict) and isinstance(key, str):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]
        else:
            return None
    return value


def _first_failure(exc: BaseException) -> tuple[list[str | int], BaseException]:
    """Follow the first sub-exception down to the leaf, collecting the field path."""
    path: list[str | int] = []
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
        for note in getattr(exc, "__notes__", ()):
            if isinstance(note, AttributeValidationNote):
                path.append(note.name)
            elif isinstance(note, IterableValidationNote):
                path.append(note.index)
    return path, exc
