"""A response format's schema that refers to itself before any value nests is a 400 naming the field (issue 48,
item 5): llguidance compiles ``{"$ref": "#"}`` and ``$ref`` cycles, and the answer was ``""`` with
``finish_reason: stop``, not JSON. Recursion through ``properties`` or ``items`` (a tree) stays accepted."""

from __future__ import annotations

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_proxy.errors import ProxyError
from memt_proxy.structured import ref_cycle, structure

CYCLES = {
    "root": {"$ref": "#"},
    "two definitions": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "through anyOf": {"anyOf": [{"$ref": "#"}, {"type": "integer"}]},
    "through allOf": {"type": "object", "allOf": [{"$ref": "#"}]},
    "a property itself": {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}},
    "escaped pointer": {"$defs": {"a/b": {"not": {"$ref": "#/$defs/a~1b"}}}, "$ref": "#/$defs/a~1b"},
}
RECURSIVE = {
    "tree": {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["name"]},
    "linked list": {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"},
    "no ref": {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
}


@pytest.fixture(scope="module")
def chat_format(nano_checkpoint):
    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))[0]


@pytest.mark.parametrize("name", CYCLES)
def test_a_ref_cycle_is_a_400_naming_the_field(chat_format, name):
    assert ref_cycle(CYCLES[name])
    with pytest.raises(ProxyError) as info:
        structure(chat_format, schema=CYCLES[name], schema_param="response_format", tools=None, tools_param="tools", forced=False, name=None)
    error = info.value
    assert error.status == 400 and error.param == "response_format" and error.code == "invalid_schema"
    assert "refers to itself" in error.message and "#" in error.message


@pytest.mark.parametrize("name", RECURSIVE)
def test_recursion_through_nesting_is_accepted(chat_format, name):
    assert ref_cycle(RECURSIVE[name]) == ""
    grammar = structure(chat_format, schema=RECURSIVE[name], schema_param="response_format", tools=None, tools_param="tools", forced=False, name=None)
    assert grammar is not None and grammar.field == "json_schema"


def test_the_cycle_is_named():
    assert ref_cycle(CYCLES["two definitions"]) == "#/$defs/a -> #/$defs/b -> #/$defs/a"
