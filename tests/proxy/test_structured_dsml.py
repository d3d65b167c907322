"""Forced tool calls on a DSML chat format (Flash, ``encoding_dsv4.py``), without an upstream: the grammar
``memt_proxy.structured`` builds, compiled by the core's ``GrammarCompiler`` against the tiny Flash
tokenizer, accepts the calls the checkpoint's own template renders for valid arguments, rejects ill-typed
ones, and everything it lets through (random walks included) is read back by ``FlashParser`` as
arguments that validate against the tool's schema."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.grammar import GrammarCompiler
from memt_proxy.errors import ProxyError
from memt_proxy.structured import DSML, structure

EOS = "<｜end▁of▁sentence｜>"


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


LOOKUP = tool("lookup", {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 12}, "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
    "required": ["query"],
})
SETTINGS = tool("settings", {
    "type": "object", "additionalProperties": False,
    "properties": {
        "mode": {"enum": ["fast", "slow"]},
        "enabled": {"type": "boolean"},
        "weights": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        "style": {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}, "width": {"type": "integer", "minimum": 1, "maximum": 5}},
                  "required": ["color"], "additionalProperties": False},
    },
    "required": ["mode", "enabled"],
})
TOOLS = [LOOKUP, SETTINGS]


@pytest.fixture(scope="module")
def flash(flash_checkpoint):
    """The tiny Flash checkpoint's chat format and parser."""
    return load_chat_format(flash_checkpoint, tokenizer=load_tokenizer(flash_checkpoint))


@pytest.fixture(scope="module")
def compiler(flash):
    return GrammarCompiler(flash[0].tokenizer)


def forced(chat_format, tools=TOOLS, name: str | None = None):
    grammar = structure(chat_format, schema=None, schema_param="response_format", tools=tools, tools_param="tools", forced=True, name=name)
    assert grammar is not None and grammar.field == "ebnf" and grammar.source.startswith("%llguidance") and not grammar.raw
    return grammar


def rendered(chat_format, name: str, arguments: dict) -> str:
    """The call as the checkpoint's template writes it in an assistant turn (without the end token)."""
    call = {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    text = chat_format.encoder.encode_messages([{"role": "assistant", "content": "", "tool_calls": [call]}], add_default_bos_token=False)
    assert text.startswith("\n\n") and text.endswith(EOS), text
    return text[2:-len(EOS)]


def rest(chat_format, text: str, name: str | None) -> str:
    """``text`` after the forced prefix the chat format puts in the prompt."""
    prefix = chat_format.tool_call_prefix(name)
    assert text.startswith(prefix), (text, prefix)
    return text[len(prefix):]


def accepts(compiler, grammar, text: str) -> bool:
    """Whether the compiled grammar allows ``text``'s tokens one by one, and then the end token."""
    state, tokenizer = compiler.compile(grammar.field, grammar.source), compiler.tokenizer
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not state.allowed(len(tokenizer))[token]:
            return False
        state.advance(token)
    return bool(state.allowed(len(tokenizer))[tokenizer.eos_token_id])


def read_back(parser, text: str) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in parser.parse(text + EOS).tool_calls]


def parameters(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


# ---------------------------------------------------------------------- accepted and read back

VALID = [
    ("lookup", {"query": "Oslo"}),
    ("lookup", {"query": "two words", "limit": 20}),
    ("lookup", {"query": "", "limit": 1}),
    ("lookup", {"query": 'a " & {x}'}),
    ("settings", {"mode": "fast", "enabled": True}),
    ("settings", {"mode": "slow", "enabled": False, "weights": [], "style": {"color": "red"}}),
    ("settings", {"mode": "slow", "enabled": True, "weights": [1, -2.5, 3e-05], "style": {"color": "blue", "width": 5}}),
]


@pytest.mark.parametrize("name, arguments", VALID)
def test_what_the_template_renders_is_accepted_and_read_back(flash, compiler, name, arguments):
    chat_format, parser = flash
    jsonschema.validate(arguments, parameters(name))  # (the case is valid)
    text = rendered(chat_format, name, arguments)
    assert accepts(compiler, forced(chat_format, name=name), rest(chat_format, text, name))
    assert accepts(compiler, forced(chat_format), rest(chat_format, text, None))
    assert read_back(parser, text) == [(name, arguments)]


# ---------------------------------------------------------------------- rejected

INVALID = [
    ("lookup", {"limit": 3}, "a required parameter missing"),
    ("lookup", {"query": "Oslo", "limit": 21}, "an integer above its maximum"),
    ("lookup", {"query": "Oslo", "limit": "3"}, "an integer written as a string"),
    ("lookup", {"query": "Oslo", "limit": 2.5}, "a number for an integer"),
    ("lookup", {"query": "far too long a query"}, "a string over its maxLength"),
    ("lookup", {"query": "a<b"}, "raw text never holds '<'"),
    ("lookup", {"query": 7}, "a number for a string"),
    ("lookup", {"query": "Oslo", "extra": 1}, "a parameter the schema does not have"),
    ("lookup", {"limit": 3, "query": "Oslo"}, "parameters out of the schema's order"),
    ("settings", {"mode": "medium", "enabled": True}, "a value outside the enum"),
    ("settings", {"mode": "fast", "enabled": "yes"}, "a string for a boolean"),
    ("settings", {"mode": "fast", "enabled": True, "weights": [1, "2"]}, "a string in an array of numbers"),
    ("settings", {"mode": "fast", "enabled": True, "weights": [1, 2, 3, 4]}, "an array over its maxItems"),
    ("settings", {"mode": "fast", "enabled": True, "style": {"width": 2}}, "a nested object without its required key"),
    ("settings", {"mode": "fast", "enabled": True, "style": {"color": "red", "size": 1}}, "a nested key additionalProperties forbids"),
]


@pytest.mark.parametrize("name, arguments, why", INVALID, ids=[case[2] for case in INVALID])
def test_ill_typed_calls_are_rejected(flash, compiler, name, arguments, why):
    chat_format, _ = flash
    text = rendered(chat_format, name, arguments)
    assert not accepts(compiler, forced(chat_format, name=name), rest(chat_format, text, name)), why
    assert not accepts(compiler, forced(chat_format), rest(chat_format, text, None)), why


def test_the_call_must_be_closed_and_be_one_of_the_offered_tools(flash, compiler):
    chat_format, _ = flash
    text = rendered(chat_format, "lookup", {"query": "Oslo"})
    required, named = forced(chat_format), forced(chat_format, name="lookup")
    closing = f"\n</{DSML}tool_calls>"
    assert not accepts(compiler, named, rest(chat_format, text, "lookup")[: -len(closing)])  # stops before the closing markup
    assert not accepts(compiler, named, rest(chat_format, text, "lookup") + "\nmore")  # nothing after it
    other = rendered(chat_format, "search", {"query": "Oslo"})
    assert not accepts(compiler, forced(chat_format), rest(chat_format, other, None))  # a tool not offered
    settings = rendered(chat_format, "settings", {"mode": "fast", "enabled": True})
    assert not accepts(compiler, named, rest(chat_format, settings, "settings"))  # another tool's arguments
    assert accepts(compiler, required, rest(chat_format, text, None))


# ---------------------------------------------------------------------- string forms and fallbacks


def one(name: str, schema: dict, required: bool = True) -> list[dict]:
    return [tool("f", {"type": "object", "properties": {name: schema}, "required": [name] if required else []})]


def element(name: str, string: bool, value: str) -> str:
    """One DSML ``parameter`` element, spelled out (to write what the template would not)."""
    return f'<{DSML}parameter name="{name}" string="{"true" if string else "false"}">{value}</{DSML}parameter>\n'


def call(*elements: str) -> str:
    """The rest of a named call after its forced prefix."""
    return "".join(elements) + f"</{DSML}invoke>\n</{DSML}tool_calls>"


def test_an_anchored_pattern_is_raw_text_an_unanchored_one_or_a_format_json(flash, compiler):
    chat_format, parser = flash
    code = forced(chat_format, one("code", {"type": "string", "pattern": "^[A-Z]\\d{3}$"}), "f")
    assert accepts(compiler, code, call(element("code", True, "B123")))
    assert not accepts(compiler, code, call(element("code", True, "b123")))
    assert not accepts(compiler, code, call(element("code", True, "B1234")))
    # a pattern that may match anywhere, or a format: the value is a JSON string, checked by llguidance
    for schema, good, bad in (({"type": "string", "pattern": "[0-9]"}, '"ab1c"', '"abc"'),
                              ({"type": "string", "format": "date"}, '"2024-02-29"', '"yesterday"')):
        grammar = forced(chat_format, one("v", schema), "f")
        assert accepts(compiler, grammar, call(element("v", False, good)))
        assert not accepts(compiler, grammar, call(element("v", False, bad)))
        assert not accepts(compiler, grammar, call(element("v", True, good[1:-1])))
        [(_, arguments)] = read_back(parser, chat_format.tool_call_prefix("f") + call(element("v", False, good)))
        jsonschema.validate(arguments, {"properties": {"v": schema}})
    length = forced(chat_format, one("s", {"type": "string", "minLength": 2, "maxLength": 3}), "f")
    assert [accepts(compiler, length, call(element("s", True, "é" * n))) for n in range(5)] == [False, False, True, True, False]
    enum = forced(chat_format, one("e", {"enum": ["a<b", "c"]}), "f")  # '<' in a value: JSON, so the closing tag stays unambiguous
    assert accepts(compiler, enum, call(element("e", False, '"a<b"'))) and not accepts(compiler, enum, call(element("e", True, "c")))


def test_refs_resolve_against_the_tool_schema(flash, compiler):
    chat_format, parser = flash
    schema = {"type": "object", "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
              "properties": {"at": {"$ref": "#/$defs/Point"}}, "required": ["at"]}
    grammar = forced(chat_format, [tool("f", schema)], "f")
    assert accepts(compiler, grammar, call(element("at", False, '{"x": 3}')))
    assert not accepts(compiler, grammar, call(element("at", False, '{"x": "3"}')))
    [(_, arguments)] = read_back(parser, chat_format.tool_call_prefix("f") + call(element("at", False, '{"x": 3}')))
    jsonschema.validate(arguments, schema)


def test_schemas_without_properties_get_free_form_parameters(flash, compiler):
    chat_format, parser = flash
    anything = forced(chat_format, [tool("f", {"type": "object"})], "f")
    free = call(element("note", True, "any text"), element("n", False, "[1, {\"a\": null}]"))
    assert accepts(compiler, anything, call()) and accepts(compiler, anything, free)
    assert read_back(parser, chat_format.tool_call_prefix("f") + free) == [("f", {"note": "any text", "n": [1, {"a": None}]})]
    counts = forced(chat_format, [tool("f", {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}})], "f")
    assert accepts(compiler, counts, call(element("a", False, "1"), element("b", False, "2")))
    assert not accepts(compiler, counts, call(element("a", False, "-1")))
    assert not accepts(compiler, counts, call(element("a", True, "1")))
    labels = forced(chat_format, [tool("f", {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}})], "f")
    assert accepts(compiler, labels, call(element("a", True, "abc"))) and not accepts(compiler, labels, call(element("a", True, "abcd")))
    nothing = forced(chat_format, [tool("f", {"type": "object", "additionalProperties": False})], "f")
    assert accepts(compiler, nothing, call()) and not accepts(compiler, nothing, call(element("a", False, "1")))
    either = forced(chat_format, [tool("f", {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "object"}]})], "f")
    assert accepts(compiler, either, call(element("a", False, "1")))  # not enforced precisely, but never an error
    no_parameters = forced(chat_format, [{"type": "function", "function": {"name": "f"}}], "f")
    assert accepts(compiler, no_parameters, call())


def test_a_name_dsml_cannot_write_is_a_400(flash):
    chat_format, _ = flash
    for tools, param in (([tool('say"hi', {"type": "object"})], "tools[0].function.name"),
                         (one('a"b', {"type": "integer"}), "tools[0].function.parameters.properties")):
        with pytest.raises(ProxyError) as info:
            structure(chat_format, schema=None, schema_param="response_format", tools=tools, tools_param="tools", forced=True, name=None)
        assert (info.value.status, info.value.param) == (400, param)


def test_response_format_with_tools_allows_the_answer_or_a_dsml_call(flash, compiler):
    chat_format, parser = flash
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
    grammar = structure(chat_format, schema=schema, schema_param="response_format", tools=TOOLS, tools_param="tools", forced=False, name=None)
    assert grammar.field == "ebnf" and not grammar.raw  # a call must be parsed out
    assert accepts(compiler, grammar, '{"city":"Paris"}')
    text = rendered(chat_format, "lookup", {"query": "Oslo", "limit": 2})
    assert accepts(compiler, grammar, text) and read_back(parser, text) == [("lookup", {"query": "Oslo", "limit": 2})]
    assert not accepts(compiler, grammar, rendered(chat_format, "lookup", {"limit": 2}))
    assert not accepts(compiler, grammar, 'Sure: {"city":"Paris"}')


# ---------------------------------------------------------------------- everything it lets through


def walk(compiler, grammar, rng: random.Random, limit: int = 2000) -> str | None:
    """A random path through the grammar, token by token (uniform among the allowed ones); its text, or None
    when it has not ended within ``limit`` tokens."""
    state, tokenizer = compiler.compile(grammar.field, grammar.source), compiler.tokenizer
    tokens = []
    for _ in range(limit):
        allowed = state.allowed(len(tokenizer)).nonzero().flatten().tolist()
        token = rng.choice(allowed)
        if token == tokenizer.eos_token_id:
            return tokenizer.decode(tokens, skip_special_tokens=False)
        state.advance(token)
        tokens.append(token)
    return None


@pytest.mark.parametrize("name", [None, "settings"])
def test_random_walks_read_back_as_valid_arguments(flash, compiler, name):
    chat_format, parser = flash
    grammar, rng = forced(chat_format, name=name), random.Random(16)
    seen, unfinished = set(), 0
    for _ in range(30):
        text = walk(compiler, grammar, rng)
        if text is None:
            unfinished += 1
            continue
        calls = read_back(parser, chat_format.tool_call_prefix(name) + text)
        assert len(calls) == 1, text
        called, arguments = calls[0]
        jsonschema.validate(arguments, parameters(called))
        seen.add(called)
    assert unfinished <= 3
    assert seen == ({"lookup", "settings"} if name is None else {name})
