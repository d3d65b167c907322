"""Forced tool calls through the live proxy on a Flash (DSML) checkpoint with random, untrained weights.

Sampled at temperature 1.0 with many seeds, the model explores freely, so every well-formed call here is
the grammar's doing (``memt_proxy.structured``): each returned call names an offered tool (the one named,
for a named ``tool_choice``) and its arguments validate against that tool's schema, streamed or not, on
Chat Completions and the Responses API. Most string parameters carry a ``maxLength`` to keep calls short;
an unbounded one is closed by the core when ``max_tokens`` runs low (its raw text ended by its tag).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from e2e.proxies import ProxyServer

pytestmark = pytest.mark.timeout(900)

MAX_TOKENS = 600  # a call of the tiny tokenizer's DSML costs ~20 tokens per tag


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = [
    tool("lookup", {
        "type": "object",
        "properties": {"query": {"type": "string", "maxLength": 16}, "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
        "required": ["query"],
    }),
    tool("set_mode", {
        "type": "object", "additionalProperties": False,
        "properties": {"mode": {"enum": ["fast", "slow", "off"]}, "enabled": {"type": "boolean"}},
        "required": ["mode", "enabled"],
    }),
    tool("plot", {
        "type": "object", "additionalProperties": False,
        "properties": {
            "points": {"type": "array", "items": {"type": "number", "minimum": -100, "maximum": 100}, "maxItems": 3},
            "code": {"type": "string", "pattern": "^[A-Z][0-9]{3}$"},
            "style": {"type": "object", "additionalProperties": False, "required": ["color"],
                      "properties": {"color": {"enum": ["red", "blue"]}, "width": {"type": "integer", "minimum": 1, "maximum": 5}}},
        },
        "required": ["points"],
    }),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "Do something useful."}]


@pytest.fixture(scope="module")
def flash_proxy(flash_server, flash_checkpoint):
    with ProxyServer(flash_server.url, flash_checkpoint) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def client(flash_proxy):
    return flash_proxy.openai("unused", timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def valid(name: str, arguments: str) -> dict:
    """The call's arguments, checked against its tool's schema."""
    assert name in SCHEMAS, name
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, SCHEMAS[name])
    return parsed


def test_required_calls_are_valid_whatever_the_seed(client, model):
    names = []
    for seed in range(12):
        choice = client.chat.completions.create(
            model=model, messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
        ).choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice.message.content)
        [call] = choice.message.tool_calls
        valid(call.function.name, call.function.arguments)
        names.append(call.function.name)
    assert len(set(names)) >= 2, names  # the random model does explore: the grammar, not luck, keeps the calls valid


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_named_calls_streamed_are_valid(client, model, name):
    for seed in range(3):
        chunks = list(client.chat.completions.create(
            model=model, messages=QUESTION, tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}},
            temperature=1.0, seed=100 + seed, max_tokens=MAX_TOKENS, stream=True,
        ))
        deltas = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
        assert deltas and {d.function.name for d in deltas if d.function.name} == {name}, chunks[-3:]
        valid(name, "".join(d.function.arguments or "" for d in deltas))
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_plot_explores_its_optional_and_nested_parameters(client, model):
    """Optional parameters (a pattern string, a nested object) appear in some calls, and validate when they do."""
    keys = set()
    for seed in range(8):
        message = client.chat.completions.create(
            model=model, messages=QUESTION, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "plot"}},
            temperature=1.0, seed=200 + seed, max_tokens=MAX_TOKENS,
        ).choices[0].message
        [call] = message.tool_calls
        keys |= set(valid("plot", call.function.arguments))
    assert {"points"} < keys, keys


def test_responses_api_forced_calls_are_valid(client, model):
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in TOOLS]
    for choice in ["required", {"type": "function", "name": "set_mode"}]:
        response = client.responses.create(model=model, input="Do something useful.", tools=tools, tool_choice=choice,
                                           temperature=1.0, max_output_tokens=MAX_TOKENS, store=False)
        calls = [item for item in response.output if item.type == "function_call"]
        assert len(calls) == 1, response.output
        valid(calls[0].name, calls[0].arguments)
        if isinstance(choice, dict):
            assert calls[0].name == "set_mode"


def test_response_format_with_tools_gives_the_answer_or_a_valid_call(client, model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    kinds = set()
    for seed in range(8):
        message = client.chat.completions.create(
            model=model, messages=QUESTION, tools=TOOLS, temperature=1.0, seed=300 + seed, max_tokens=MAX_TOKENS,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        ).choices[0].message
        if message.tool_calls:
            [call] = message.tool_calls
            valid(call.function.name, call.function.arguments)
            kinds.add("call")
        else:
            jsonschema.validate(json.loads(message.content), schema)
            kinds.add("answer")
    assert kinds == {"answer", "call"}  # both ways out of the grammar are taken (the seeds are fixed)


def test_an_unbounded_string_is_closed_within_max_tokens(client, model):
    """A random model never ends a raw string by itself; the core closes it, and the call, within the budget."""
    note = tool("note", {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
                         "required": ["text", "n"]})
    for seed in range(4):
        choice = client.chat.completions.create(
            model=model, messages=QUESTION, tools=[note], tool_choice={"type": "function", "function": {"name": "note"}},
            temperature=1.0, seed=400 + seed, max_tokens=160,
        ).choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice.message.content)
        [call] = choice.message.tool_calls
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, note["function"]["parameters"])
        assert arguments["text"]
