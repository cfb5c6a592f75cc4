"""Nothing a client sends is a 500 (issue 17): valid bodies of every endpoint, mutated.

Each example takes a valid body, replaces, deletes or adds values at places chosen
through its tree (wrong types, huge and negative numbers, nested garbage, names of
other fields), posts it to the in-process app and asserts: no 5xx, no traceback or
"Internal server error" in the body (streams report errors in-band), and the
simulator still answers the untouched body.  Every endpoint that reads a body is here
(``test_every_endpoint_with_a_body_is_fuzzed`` checks the router for new ones).  The
``quick`` Hypothesis profile keeps it to a few seconds for ``make test``;
``HYPOTHESIS_PROFILE=thorough`` tries 500 examples per endpoint, and
``LLMSIM_FUZZ_EXAMPLES=N`` any number.  A fuzzer found ``source.type`` given as a list or object in
``/v1/messages`` (``TypeError: unhashable``); the regression test is below.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from llmsim.app import build_router
from tests.api.fakes import FakeResponse, post, running

HI = [{"role": "user", "content": "Hello there"}]
MODEL = "llmsim/sim-model"
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
TOOL_ANTHROPIC = {"name": "f", "input_schema": SCHEMA}
LORA = "fuzz-lora"

#: path -> a valid body, rich enough that mutations reach the fields' checks.
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "messages": [{"role": "system", "content": "Be brief."}, *HI],
        "max_tokens": 3,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "stop": ["zz"],
        "tools": [TOOL],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    },
    "/v1/completions": {"prompt": ["Hi", "there"], "max_tokens": 3, "n": 2, "logprobs": 2, "echo": True},
    "/v1/responses": {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        "max_output_tokens": 3,
        "store": False,
        "tools": [{"type": "function", "name": "f", "parameters": SCHEMA}],
        "text": {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}},
    },
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 3,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, IMAGE]}],
        "tools": [{"name": "f", "input_schema": SCHEMA}],
    },
    "/v1/embeddings": {"input": ["Hi", "there"], "dimensions": 8, "encoding_format": "float"},
    "/tokenize": {"prompt": "Hello there", "add_special_tokens": True},
    "/v1/chat/completions/render": {"messages": HI},
    "/inference/v1/generate": {"token_ids": [11, 12, 13], "sampling_params": {"max_tokens": 3, "n": 2}},
    "/admin/config": {"time-to-first-token": "0s", "failure-injection-rate": 0},
    "/v1/messages/count_tokens": {"model": MODEL, "system": "Be brief.", "messages": HI, "tools": [TOOL_ANTHROPIC]},
    "/detokenize": {"tokens": [11, 12, 13]},
    "/v1/completions/render": {"prompt": "Hello there", "max_tokens": 3},
    "/v1/responses/render": {"input": "Hello there", "instructions": "Be brief."},
    "/v1/messages/render": {"model": MODEL, "max_tokens": 3, "messages": HI},
    "/v1/load_lora_adapter": {"lora_name": LORA, "lora_path": "/tmp/fuzz-lora", "load_inplace": True},
    "/v1/unload_lora_adapter": {"lora_name": LORA},
}
#: path -> a request that puts the simulator in the state its valid body needs.
SETUP: dict[str, tuple[str, dict[str, Any]]] = {
    "/v1/unload_lora_adapter": ("/v1/load_lora_adapter", VALID["/v1/load_lora_adapter"]),
}
#: Endpoints that take no body (or only a query string): nothing to fuzz.
BODILESS = {"/ping", "/sleep", "/wake_up", "/v1/responses/{response_id}/cancel"}
#: ``LLMSIM_FUZZ_EXAMPLES=N``: N examples per endpoint instead of the profile's number.
EXAMPLES = {"max_examples": int(os.environ["LLMSIM_FUZZ_EXAMPLES"])} if "LLMSIM_FUZZ_EXAMPLES" in os.environ else {}

#: Names a mutation adds: fields of the endpoints above, so they reach real checks.
FIELDS = sorted(
    {"type", "source", "content", "role", "text", "schema", "name"} | {k for b in VALID.values() for k in b}
)
#: Values a mutation puts in place: every JSON type, edge numbers, nesting.
JUNK = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 0.5, -0.0, 1e308]),
        st.integers(-(10**6), 10**6),
        st.text(max_size=8),
        st.sampled_from(["", "base64", "url", "text", "image", "function", "json_schema", "user", "auto", MODEL]),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3),
    max_leaves=8,
)
MUTANTS_PER_EXAMPLE = 8  # bodies posted to one simulator per example

Location = tuple[str | int, ...]


def locations(value: object, here: Location = ()) -> list[Location]:
    """Every place in a JSON value (the root is ``()``), so a mutation picks among them evenly."""
    out = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            out += locations(item, (*here, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += locations(item, (*here, index))
    return out


def mutation(body: object) -> st.SearchStrategy[tuple[Location, str, str, object]]:
    return st.tuples(
        st.sampled_from(locations(body)[1:]),  # not the root: a body that is not an object fails at once
        st.sampled_from(["set", "set", "set", "delete", "add"]),
        st.sampled_from(FIELDS),
        st.one_of(JUNK, st.lists(JUNK, max_size=2), st.dictionaries(st.sampled_from(FIELDS), JUNK, max_size=2)),
    )


def mutate(body: object, mutations: list[tuple[Location, str, str, object]]) -> object:
    """``body`` with each mutation applied at its location (skipped once an earlier one removed it)."""
    out = copy.deepcopy(body)
    for where, op, field, value in mutations:
        parent: Any = None
        node: Any = out
        for key in where:
            if not (isinstance(node, dict) and key in node) and not (
                isinstance(node, list) and isinstance(key, int) and key < len(node)
            ):
                break
            parent, node = node, node[key]
        else:
            if op == "add" and isinstance(node, dict):
                node[field] = value
            elif op == "add" and isinstance(node, list):
                node.append(value)
            elif parent is None:
                out = value
            elif op == "delete":
                del parent[where[-1]]
            else:
                parent[where[-1]] = value
    return out


async def set_up(sim: Any, path: str) -> None:
    if path in SETUP:
        setup_path, body = SETUP[path]
        assert (await post(sim, setup_path, body)).status == 200


def assert_handled(response: FakeResponse, body: object) -> None:
    assert response.status < 500, (body, response.body[:300])
    for leak in (b"Traceback", b"Internal server error", b'"code":500'):
        assert leak not in response.body, (body, response.body[:300])


@pytest.mark.parametrize("path", sorted(VALID))
@seed(17)
@settings(suppress_health_check=[HealthCheck.too_slow], **EXAMPLES)
@given(data=st.data(), streaming=st.booleans())
async def test_mutated_bodies_are_never_a_5xx(path: str, data: st.DataObject, streaming: bool) -> None:
    valid = {**VALID[path], "stream": True} if streaming and path != "/admin/config" else VALID[path]
    mutants = [
        mutate(valid, data.draw(st.lists(mutation(valid), min_size=1, max_size=2))) for _ in range(MUTANTS_PER_EXAMPLE)
    ]
    async with running(max_model_len=256, max_num_seqs=4, max_waiting_queue_length=8) as sim:
        for body in mutants:
            await set_up(sim, path)
            assert_handled(await post(sim, path, json.dumps(body).encode()), body)
        await set_up(sim, path)
        again = await post(sim, path, VALID[path])
    assert again.status == 200, again.body[:300]


@pytest.mark.parametrize("path", sorted(VALID))
async def test_the_bodies_mutated_are_valid(path: str) -> None:
    async with running() as sim:
        for streaming in (False, True):
            body = {**VALID[path], "stream": True} if streaming and path != "/admin/config" else VALID[path]
            await set_up(sim, path)
            response = await post(sim, path, body)
            assert response.status == 200, response.body


@pytest.mark.parametrize("path", sorted(VALID))
async def test_bodies_that_are_not_objects_are_never_a_5xx(path: str) -> None:
    async with running() as sim:
        for raw in (b"[1]", b'"x"', b"null", b"5", b"{", b"\xff", b""):
            assert_handled(await post(sim, path, raw), raw)


@pytest.mark.parametrize("kind", ["image", "document"])
@pytest.mark.parametrize("source_type", [["base64"], {"base64": True}])
async def test_a_messages_source_type_that_is_a_list_or_object_is_a_400(kind: str, source_type: object) -> None:
    block = {"type": kind, "source": {"type": source_type, "media_type": "image/png", "data": "aGk="}}
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": [block]}]}
    async with running() as sim:
        response = await post(sim, "/v1/messages", body)
    assert response.status == 400, response.body
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == "messages.0.content.0.source.type: Input should be 'base64' or 'url'"


def test_every_endpoint_with_a_body_is_fuzzed() -> None:
    router = build_router()
    table = [*router._exact.values(), *router._patterns]  # (the router has no public listing)
    posted = {"/".join(route.segments) for route in table if "POST" in route.handlers}
    assert posted - BODILESS == set(VALID), "an endpoint takes a body: give VALID a valid one, or BODILESS its path"
