"""The request classes' fast body readers (``structure.read_bodies_fast``) read a body
exactly as cattrs's generated functions do, and leave every refusal to cattrs."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsim.api import structure as structure_module
from llmsim.api.chat.request import ChatCompletionRequest
from llmsim.api.completions.request import CompletionRequest
from llmsim.api.errors import ApiError
from llmsim.api.structure import _BODY_READERS, _body_reader, converter, read_bodies_fast, structure

MESSAGES = [{"role": "user", "content": "Hello there"}]

BODIES: list[tuple[type, dict[str, Any]]] = [
    (ChatCompletionRequest, {"model": "m", "messages": MESSAGES, "max_tokens": 100, "stream": True}),
    (ChatCompletionRequest, {"messages": MESSAGES, "n": "2", "temperature": 1, "stream": "yes", "unknown": [1]}),
    (
        ChatCompletionRequest,
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stop": ["a", "b"],
            "stream_options": {"include_usage": True},
            "tool_choice": "none",
            "logit_bias": {"5": 1},
            "chat_template_kwargs": {"x": 1},
        },
    ),
    (CompletionRequest, {"model": "m", "prompt": "Hello there", "max_tokens": 100, "ignore_eos": True}),
    (CompletionRequest, {"prompt": [[1, 2], [3]], "stop": "x", "echo": 1, "logprobs": 2, "seed": "7"}),
    (CompletionRequest, {"prompt": [1, 2, 3]}),
]

REFUSED: list[tuple[type, dict[str, Any]]] = [
    (ChatCompletionRequest, {"model": "m"}),  # messages missing
    (ChatCompletionRequest, {"messages": MESSAGES, "max_tokens": "many", "n": []}),
    (ChatCompletionRequest, {"messages": [{"role": 5}]}),
    (ChatCompletionRequest, {"messages": MESSAGES, "tool_choice": "sometimes"}),
    (CompletionRequest, {"max_tokens": 5}),  # prompt missing
    (CompletionRequest, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
    (CompletionRequest, {"prompt": [1, "a"], "temperature": "hot"}),
]


def _cattrs_error(body: dict[str, Any], cls: type) -> ApiError:
    """The 400 that cattrs's own path makes of ``body`` (the fast reader left out)."""
    reader = _BODY_READERS.pop(cls)
    try:
        with pytest.raises(ApiError) as refused:
            structure(body, cls)
    finally:
        _BODY_READERS[cls] = reader
    return refused.value


@pytest.mark.parametrize(("cls", "body"), BODIES)
def test_a_body_reads_as_cattrs_reads_it(cls: type, body: dict[str, Any]) -> None:
    read = _body_reader(cls)(body)
    expected = converter.structure(body, cls)
    assert read is not None
    assert type(read) is cls and read == expected
    assert list(vars(read).items()) == list(vars(expected).items())  # same values, in field order
    assert structure(body, cls) == expected


@pytest.mark.parametrize(("cls", "body"), REFUSED)
def test_a_refused_body_gets_cattrs_error(cls: type, body: dict[str, Any]) -> None:
    assert _body_reader(cls)(body) is None
    with pytest.raises(ApiError) as refused:
        structure(body, cls)
    expected = _cattrs_error(body, cls)
    assert (refused.value.status, refused.value.message, refused.value.param) == (
        expected.status,
        expected.message,
        expected.param,
    )


class _NoCattrs:
    def structure(self, *_: object) -> None:
        raise AssertionError("cattrs was called")


def test_the_hot_request_classes_are_read_without_cattrs(monkeypatch: pytest.MonkeyPatch) -> None:
    structure({"messages": MESSAGES}, ChatCompletionRequest)  # the readers are built on first use
    structure({"prompt": "Hello"}, CompletionRequest)
    monkeypatch.setattr(structure_module, "converter", _NoCattrs())
    assert structure({"messages": MESSAGES, "stream": True}, ChatCompletionRequest).stream is True
    assert structure({"prompt": "Hello", "max_tokens": 3}, CompletionRequest).max_tokens == 3


def test_a_class_whose_init_does_more_than_store_is_refused() -> None:
    @attrs.frozen(slots=False)
    class Checked:
        n: int = attrs.field(default=0, validator=attrs.validators.ge(0))

    @attrs.frozen
    class Slotted:
        n: int = 0

    for cls in (Checked, Slotted):
        with pytest.raises(TypeError):
            read_bodies_fast(cls)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.sampled_from(["", "3", "x", "yes"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner),
    max_leaves=6,
)
_CHAT_KEYS = [field.name for field in attrs.fields(ChatCompletionRequest)] + ["unknown"]
_COMPLETION_KEYS = [field.name for field in attrs.fields(CompletionRequest)] + ["unknown"]
_GOOD = {
    "messages": st.just(MESSAGES),
    "prompt": st.sampled_from(["Hello", [1, 2], ["a", "b"]]),
    "stream": st.booleans(),
    "max_tokens": st.integers(1, 50),
    "n": st.integers(1, 3),
    "stop": st.sampled_from(["x", ["x", "y"]]),
    "stream_options": st.just({"include_usage": True}),
}


def _bodies(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    value = {key: _GOOD.get(key, _JSON_VALUES) | _JSON_VALUES for key in keys}
    return st.lists(st.sampled_from(keys), max_size=8).flatmap(
        lambda chosen: st.fixed_dictionaries({key: value[key] for key in chosen})
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.sampled_from([ChatCompletionRequest, CompletionRequest]).flatmap(
        lambda cls: st.tuples(st.just(cls), _bodies(_CHAT_KEYS if cls is ChatCompletionRequest else _COMPLETION_KEYS))
    )
)
def test_any_body_reads_as_cattrs_reads_it_or_is_left_to_cattrs(case: tuple[type, dict[str, Any]]) -> None:
    cls, body = case
    read = _body_reader(cls)(body)
    try:
        expected = converter.structure(body, cls)
    except Exception:
        assert read is None
        return
    assert read is not None and read == expected
    assert list(vars(read).items()) == list(vars(expected).items())
