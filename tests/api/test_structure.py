"""Scalars are read as vLLM's pydantic request models read them (pydantic 2, lax mode).

The expectations were taken from pydantic 2.14 itself, validating the decoded body as
FastAPI does (``model_validate`` of what the JSON decoder gave, on ``int | None``,
``float | None``, ``bool | None`` and ``str | None`` fields); the pydantic tests below
re-ask it wherever pydantic is installed, so that a drift shows.
"""

from __future__ import annotations

import math

import attrs
import orjson
import pytest

from llmsim.api.errors import ApiError
from llmsim.api.structure import structure


@attrs.frozen(kw_only=True)
class Scalars:
    i: int | None = None
    f: float | None = None
    b: bool | None = None
    s: str | None = None


ACCEPTED: list[tuple[str, object, object]] = [
    ("i", True, 1),
    ("i", False, 0),
    ("i", "5", 5),
    ("i", " 5 ", 5),
    ("i", "5.0", 5),
    ("i", "1_000", 1000),
    ("i", 5.0, 5),
    ("f", True, 1.0),
    ("f", "5", 5.0),
    ("f", " 2.5 ", 2.5),
    ("f", "1e3", 1000.0),
    ("f", "1_0", 10.0),
    ("f", "inf", math.inf),
    ("b", 0, False),
    ("b", 1, True),
    ("b", 1.0, True),
    ("b", "True", True),
    ("b", "yes", True),
    ("b", "on", True),
    ("b", "t", True),
    ("b", "off", False),
    ("b", "0", False),
    ("b", "n", False),
]

#: (field, value, pydantic's error type, its message)
REFUSED: list[tuple[str, object, str, str]] = [
    ("i", "5.5", "int_parsing", "Input should be a valid integer, unable to parse string as an integer"),
    ("i", "1e3", "int_parsing", "Input should be a valid integer, unable to parse string as an integer"),
    ("i", "0x10", "int_parsing", "Input should be a valid integer, unable to parse string as an integer"),
    ("i", "", "int_parsing", "Input should be a valid integer, unable to parse string as an integer"),
    ("i", 5.5, "int_from_float", "Input should be a valid integer, got a number with a fractional part"),
    ("f", "", "float_parsing", "Input should be a valid number, unable to parse string as a number"),
    ("f", "abc", "float_parsing", "Input should be a valid number, unable to parse string as a number"),
    ("b", 2, "bool_parsing", "Input should be a valid boolean, unable to interpret input"),
    ("b", 1.5, "bool_type", "Input should be a valid boolean"),
    ("b", "maybe", "bool_parsing", "Input should be a valid boolean, unable to interpret input"),
    ("b", "", "bool_parsing", "Input should be a valid boolean, unable to interpret input"),
    ("s", 5, "string_type", "Input should be a valid string"),
    ("s", True, "string_type", "Input should be a valid string"),
]


@pytest.mark.parametrize(("field", "value", "expected"), ACCEPTED)
def test_lax_values_are_read_as_pydantic_reads_them(field: str, value: object, expected: object) -> None:
    read = getattr(structure(orjson.loads(orjson.dumps({field: value})), Scalars), field)
    assert read == expected and type(read) is type(expected)


@pytest.mark.parametrize(("field", "value", "kind", "message"), REFUSED)
def test_other_values_are_refused_with_pydantics_error(field: str, value: object, kind: str, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        structure({field: value}, Scalars)
    error = caught.value
    assert error.status == 400 and error.param == f"body.{field}"
    assert f"'type': '{kind}'" in error.message and f"'msg': '{message}'" in error.message


@pytest.mark.parametrize(("field", "value", "expected"), ACCEPTED)
def test_pydantic_agrees_on_the_accepted_values(field: str, value: object, expected: object) -> None:
    pydantic = pytest.importorskip("pydantic")
    model = pydantic.create_model("M", **{field: (type(expected) | None, None)})
    assert getattr(model.model_validate(orjson.loads(orjson.dumps({field: value}))), field) == expected


@pytest.mark.parametrize(("field", "value", "kind", "message"), REFUSED)
def test_pydantic_agrees_on_the_refused_values(field: str, value: object, kind: str, message: str) -> None:
    pydantic = pytest.importorskip("pydantic")
    types = {"i": int, "f": float, "b": bool, "s": str}
    model = pydantic.create_model("M", **{field: (types[field] | None, None)})
    with pytest.raises(pydantic.ValidationError) as caught:
        model.model_validate(orjson.loads(orjson.dumps({field: value})))
    error = caught.value.errors()[0]
    assert (error["type"], error["msg"]) == (kind, message)
