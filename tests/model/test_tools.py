"""Which tool calls the simulated model makes: llm-d-inference-sim's rules per tool_choice."""

from __future__ import annotations

import collections
import json
import random

import pytest

from llmsim.model.tools import (
    NamedToolChoice,
    PlannedCall,
    ToolCallOptions,
    ToolChoice,
    ToolChoiceError,
    ToolSchemaError,
    ToolSpec,
    plan_single_tool_call,
    plan_tool_calls,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
}
TOOLS = [
    ToolSpec.build("get_weather", WEATHER, path="tools[0].function.parameters"),
    ToolSpec.build("get_time", None, path="tools[1].function.parameters"),
    ToolSpec.build(
        "search",
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        path="tools[2].function.parameters",
    ),
]
DEFAULT = ToolCallOptions()
NEVER_MORE = ToolCallOptions(tool_call_extra_call_probability=0)
ALWAYS_MORE = ToolCallOptions(tool_call_extra_call_probability=100)


def plans(choice: ToolChoice, options: ToolCallOptions = DEFAULT, runs: int = 200) -> list[list[PlannedCall]]:
    return [plan_tool_calls(TOOLS, choice, random.Random(seed), options=options) for seed in range(runs)]


def test_none_makes_no_call() -> None:
    assert all(plan == [] for plan in plans("none", ALWAYS_MORE))


def test_named_makes_exactly_one_call_of_that_tool() -> None:
    for plan in plans(NamedToolChoice("search"), ALWAYS_MORE):
        assert [call.name for call in plan] == ["search"]
        assert isinstance(json.loads(plan[0].arguments)["q"], str)


def test_named_tool_must_exist() -> None:
    with pytest.raises(ToolChoiceError, match=r"'lookup'.*not in 'tools'.*'get_weather'"):
        plan_tool_calls(TOOLS, NamedToolChoice("lookup"), random.Random(0), options=DEFAULT)


@pytest.mark.parametrize(
    ("choice", "options", "counts"),
    [
        ("required", NEVER_MORE, {1}),
        ("required", ALWAYS_MORE, {3}),
        ("auto", NEVER_MORE, {0}),
        ("auto", ALWAYS_MORE, {3}),
        ("required", DEFAULT, {1, 2, 3}),
        ("auto", DEFAULT, {0, 1, 2, 3}),
    ],
)
def test_call_counts(choice: ToolChoice, options: ToolCallOptions, counts: set[int]) -> None:
    assert {len(plan) for plan in plans(choice, options)} == counts


def test_auto_follows_the_truncated_geometric_rule() -> None:
    """Start at 0, add a call while a 45% draw succeeds, stop at len(tools)."""
    seen = collections.Counter(len(plan) for plan in plans("auto", runs=4000))
    p = 0.45
    expected = {0: 1 - p, 1: p * (1 - p), 2: p * p * (1 - p), 3: p**3}
    for count, probability in expected.items():
        assert abs(seen[count] / 4000 - probability) < 0.03, (count, seen)


def test_tools_are_picked_uniformly_with_repeats() -> None:
    names = collections.Counter(call.name for plan in plans("required", ALWAYS_MORE, runs=1000) for call in plan)
    assert all(abs(names[tool.name] / 3000 - 1 / 3) < 0.04 for tool in TOOLS), names
    assert any(len({c.name for c in plan}) < len(plan) for plan in plans("required", ALWAYS_MORE))


def test_arguments_are_json_valid_for_their_tool() -> None:
    for plan in plans("required", ALWAYS_MORE, runs=50):
        for call in plan:
            arguments = json.loads(call.arguments)
            if call.name == "get_weather":
                assert isinstance(arguments["city"], str) and arguments["days"] >= 1
            if call.name == "get_time":
                assert arguments == {}


def test_plans_are_deterministic_per_seed() -> None:
    assert plans("auto", runs=50) == plans("auto", runs=50)


def test_required_needs_tools_and_auto_without_tools_is_text() -> None:
    with pytest.raises(ToolChoiceError, match="'required' needs at least one tool"):
        plan_tool_calls([], "required", random.Random(0), options=DEFAULT)
    assert plan_tool_calls([], "auto", random.Random(0), options=ALWAYS_MORE) == []


def test_unknown_choice_is_refused() -> None:
    with pytest.raises(ToolChoiceError, match="'any'"):
        plan_tool_calls(TOOLS, "any", random.Random(0), options=DEFAULT)  # type: ignore[arg-type]


def test_responses_rule_is_exactly_one_call() -> None:
    for choice in ("auto", "required"):
        calls = [plan_single_tool_call(TOOLS, choice, random.Random(s), options=ALWAYS_MORE) for s in range(300)]
        assert all(call is not None for call in calls)
        assert {call.name for call in calls if call} == {tool.name for tool in TOOLS}
    named = plan_single_tool_call(TOOLS, NamedToolChoice("get_time"), random.Random(0), options=DEFAULT)
    assert named == PlannedCall("get_time", "{}")
    assert plan_single_tool_call(TOOLS, "none", random.Random(0), options=DEFAULT) is None
    assert plan_single_tool_call([], "auto", random.Random(0), options=DEFAULT) is None
    with pytest.raises(ToolChoiceError):
        plan_single_tool_call([], "required", random.Random(0), options=DEFAULT)


def test_tool_spec_build_validates_with_the_tools_path() -> None:
    with pytest.raises(ToolSchemaError, match=r"^tools\[4\]\.function\.parameters\.properties\.x\.not: 'not'"):
        ToolSpec.build("bad", {"type": "object", "properties": {"x": {"not": {}}}}, path="tools[4].function.parameters")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_tool_call_integer_param": 5, "max_tool_call_integer_param": 4}, "min-tool-call-integer-param"),
        ({"min_tool_call_number_param": 1.5, "max_tool_call_number_param": 1.0}, "max-tool-call-number-param"),
        ({"min_tool_call_array_param_length": 6}, "array-param-length"),
        ({"max_tool_call_array_param_length": -1}, "max-tool-call-array-param-length: must be >= 0"),
        ({"tool_call_extra_call_probability": 101}, "tool-call-extra-call-probability: must be a percentage"),
        ({"tool_call_not_required_param_probability": -1}, "percentage"),
    ],
)
def test_options_are_validated(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ToolCallOptions(**fields)  # type: ignore[arg-type]
