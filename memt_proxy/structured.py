"""Structured outputs: the grammar a request's answer must follow, as one native sampling field.

* ``response_format`` ``json_schema`` / ``json_object`` → ``json_schema`` (the answer is the JSON itself).
* A forced tool call (``tool_choice`` required or named) → an llguidance Lark grammar sent as ``ebnf``
  (``%llguidance``, see ``memt_core.grammar``): the rest of the call after the forced prefix, its
  arguments constrained to the tool's ``parameters`` schema, then the closing markup (and the end).
  Two call formats are known:

  - JSON calls (``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``, Nano and the demo
    model): the arguments are one ``%json`` value of the whole schema.
  - DSML calls (Flash, ``encoding_dsv4.py``): one ``parameter`` element per argument, as the template
    renders them; see ``_dsml_parameters`` for the rule.
* ``response_format`` with tools the model may call (``tool_choice`` auto) → Lark: the JSON answer, or
  one such call.

A format with other calls gets no grammar for them. Schemas are checked here with llguidance, so a bad
one is a 400 naming the request field rather than an upstream error.

DSML parameters: the schema's ``properties`` in their order, each ``required`` one always, the others
optionally (then any ``required`` name without a property, as any JSON). A string-typed property
(``type`` string with ``minLength``/``maxLength``/a ``^…$`` ``pattern``, or an ``enum``/``const`` of
strings) is written as is with ``string="true"`` and never holds ``<`` (so the closing tag ends it);
every other value, and a string the raw form cannot say exactly (a ``format``, an unanchored pattern),
is JSON with ``string="false"``, constrained by its own sub-schema (the root's ``$defs`` carried along).
A schema without ``properties`` (a map of ``additionalProperties``, ``anyOf`` at the top) gets
free-form parameters: any number of identifier-named ones, valued by ``additionalProperties`` when it
is a schema, else raw text or any JSON. Top-level keywords besides those are not enforced.
When ``max_tokens`` runs low, the core's early closing ends a raw string with its tag (``memt_core.grammar``),
as long as the budget leaves room for the call's markup.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from memt_core.client.parsers import DSML, Delta
from memt_proxy.errors import BadRequest

#: JSON as the chat templates render it (``json.dumps``): what the model saw in tool calls.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
JSON_CALL_PREFIX = '<tool_call>\n{"name": "f", "arguments":'
DSML_CALL_PREFIX = f'<{DSML}tool_calls>\n<{DSML}invoke name="f">\n'
#: Keywords that do not constrain a string: such a schema can still be written as raw text.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"})
FREE_NAME = r"/[A-Za-z_][A-Za-z0-9_]*/"  # a free-form parameter's name (the parser takes any name without a quote)


@dataclass(frozen=True)
class Structure:
    """The native grammar field and its source; ``raw``: the answer is the JSON itself (no markup to parse)."""

    field: str  # "json_schema" or "ebnf"
    source: str
    raw: bool


def check_schema(schema: dict, param: str) -> None:
    """A 400 naming ``param`` when llguidance cannot compile ``schema``, or when it refers to itself where no
    value nests (``{"$ref": "#"}``, a ``$ref`` cycle): llguidance takes those, and they generate no JSON."""
    cycle = ref_cycle(schema)
    if cycle:
        raise BadRequest(
            f"{param}: the JSON schema refers to itself before any value nests ({cycle}); a $ref cycle generates no JSON and is refused",
            param=param, code="invalid_schema",
        )
    error = _schema_error(schema)
    if error:
        raise BadRequest(f"{param}: the JSON schema is not supported: {error[:300]}", param=param, code="invalid_schema")


#: keywords whose subschemas apply to the value itself (no nesting): a ``$ref`` loop through them only is a cycle
_SAME_VALUE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_VALUE = ("not", "if", "then", "else")


def ref_cycle(schema) -> str:
    """A ``$ref`` chain of ``schema`` that comes back to where it started before the value nests any deeper
    (through ``$ref``, ``allOf``/``anyOf``/``oneOf``, ``not``, ``if``/``then``/``else`` only), as
    ``"#/a -> #/b -> #/a"``; "" when there is none. Recursion through ``properties`` or ``items`` is fine."""
    nodes: dict[str, dict] = {}
    stack = [("", schema)]
    while stack:  # every subschema of the document, by its JSON pointer
        pointer, node = stack.pop()
        if isinstance(node, dict):
            nodes[pointer] = node
            stack += [(f"{pointer}/{_escape(key)}", child) for key, child in node.items() if isinstance(child, (dict, list))]
        elif isinstance(node, list):
            stack += [(f"{pointer}/{index}", child) for index, child in enumerate(node)]

    def same_value(pointer: str) -> list[str]:
        node = nodes[pointer]
        ref = node.get("$ref")
        found = [ref[1:]] if isinstance(ref, str) and ref.startswith("#") and ref[1:] in nodes else []
        for key in _SAME_VALUE_LISTS:
            if isinstance(node.get(key), list):
                found += [f"{pointer}/{key}/{i}" for i, item in enumerate(node[key]) if isinstance(item, dict)]
        return found + [f"{pointer}/{key}" for key in _SAME_VALUE if isinstance(node.get(key), dict)]

    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in nodes:
        if state.get(start):
            continue
        path, walks = [start], [iter(same_value(start))]
        state[start] = 1
        while walks:
            step = next(walks[-1], None)
            if step is None:
                state[path.pop()] = 2
                walks.pop()
            elif state.get(step) == 1:
                loop = path[path.index(step):] + [step]
                return " -> ".join("#" + p for p in loop)
            elif not state.get(step):
                state[step] = 1
                path.append(step)
                walks.append(iter(same_value(step)))
    return ""


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _schema_error(schema) -> str:
    """Why llguidance cannot compile ``schema`` ("" when it can)."""
    import llguidance

    return _grammar_error(lambda: llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False}))


def _lark_error(source: str) -> str:
    """Why llguidance cannot compile the Lark grammar ``source`` ("" when it can)."""
    import llguidance

    return _grammar_error(lambda: llguidance.LLMatcher.grammar_from_lark(source))


def _grammar_error(build) -> str:
    """Why the grammar ``build()`` makes does not validate ("" when it does)."""
    import llguidance

    try:
        return llguidance.LLMatcher.validate_grammar(build())
    except Exception as exc:  # llguidance reports unusable grammars as plain exceptions
        return str(exc) or type(exc).__name__


def structure(chat_format, *, schema: dict | None, schema_param: str, tools: list[dict] | None, tools_param: str, forced: bool, name: str | None) -> Structure | None:
    """The grammar for a request: ``schema`` of the answer (or None), the tools offered (chat shape,
    ``{"type": "function", "function": {...}}``), whether a call is forced (``name``: that tool)."""
    if schema is not None:
        check_schema(schema, schema_param)
    call_rules = _call_format(chat_format)
    if forced and tools:
        if call_rules is None:
            return None
        calls = call_rules(chat_format, tools, tools_param, name)
        return _lark([f"start: {calls[0]}", *calls[1:]], tools_param)
    if schema is None:
        return None
    if not tools or call_rules is None:
        return Structure("json_schema", json.dumps(schema), raw=True)
    calls = call_rules(chat_format, tools, tools_param, None)
    rules = [
        "start: answer | call",
        f"answer: %json {json.dumps({**schema, 'x-guidance': {'whitespace_flexible': False}})}",
        f"call: {_markup(chat_format.tokenizer, chat_format.tool_call_prefix())} ({calls[0]})",  # the prefix of a required call
        *calls[1:],
    ]
    return _lark(rules, tools_param)


def _call_format(chat_format):
    """The rule builder for the chat format's calls (JSON or DSML), or None for a format not known here."""
    prefix = chat_format.tool_call_prefix("f")
    return {JSON_CALL_PREFIX: _call_rules, DSML_CALL_PREFIX: _dsml_call_rules}.get(prefix)


def _lark(rules: list[str], tools_param: str) -> Structure:
    """The ``ebnf`` field for ``rules``; one llguidance cannot compile is a 400 rather than the core's error."""
    source = "%llguidance {}\n" + "\n".join(rules) + "\n"
    error = _lark_error(source)
    if error:
        raise BadRequest(f"{tools_param}: no tool-call grammar can be built for these tools: {error[:300]}", param=tools_param, code="invalid_schema")
    return Structure("ebnf", source, raw=False)


def _offered(tools: list[dict], tools_param: str, name: str | None):
    """``(index, function, parameters)`` of each tool the call may use (``name``: only that one), its schema checked."""
    for index, tool in enumerate(tools):
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        if not isinstance(parameters, dict):
            raise BadRequest("a tool's parameters must be a JSON schema object", param=f"{tools_param}[{index}].function.parameters")
        check_schema(parameters, f"{tools_param}[{index}].function.parameters")
        yield index, function, parameters


def _call_rules(chat_format, tools: list[dict], tools_param: str, name: str | None) -> list[str]:
    """``[alternatives, rule, …]``: the text after ``JSON_CALL_PREFIX``'s name quote (or, for ``name``, after
    its ``"arguments":``) up to and including ``</tool_call>``, one alternative per tool."""
    closing = _token(chat_format.tokenizer, "</tool_call>")
    alternatives, rules = [], []
    for index, function, parameters in _offered(tools, tools_param, name):
        head = "" if name is not None else _lark_string(function["name"] + '", "arguments":') + " "
        alternatives.append(f"call{index}")
        rules.append(f'call{index}: {head}" " args{index} "}}\\n" {closing}')
        rules.append(f"args{index}: %json {json.dumps({**parameters, 'x-guidance': JSON_STYLE})}")
    return [" | ".join(alternatives)] + rules


# ---------------------------------------------------------------------- DSML calls


def _dsml_call_rules(chat_format, tools: list[dict], tools_param: str, name: str | None) -> list[str]:
    """``[alternatives, rule, …]``: the text after the DSML prefix's ``invoke name="`` (or, for ``name``,
    after its ``">\\n``) up to and including ``</｜DSML｜tool_calls>``, one alternative per tool."""
    tokenizer = chat_format.tokenizer
    closing = _markup(tokenizer, f"</{DSML}invoke>\n</{DSML}tool_calls>")
    alternatives, rules = [], []
    for index, function, parameters in _offered(tools, tools_param, name):
        _check_dsml_name(function["name"], f"{tools_param}[{index}].function.name")
        head = "" if name is not None else _lark_string(function["name"] + '">\n') + " "
        sequence, parameter_rules = _dsml_parameters(tokenizer, parameters, f"t{index}", f"{tools_param}[{index}].function.parameters")
        alternatives.append(f"call{index}")
        rules.append(f"call{index}: {head}{sequence} {closing}")
        rules += parameter_rules
    return [" | ".join(alternatives)] + rules


def _check_dsml_name(name: str, param: str) -> None:
    """DSML writes names in ``name="…"`` as they are: one with a quote (or none) cannot be read back."""
    if not name or '"' in name:
        raise BadRequest(f"{param}: the name {name[:60]!r} cannot be written in this model's tool calls (DSML): it must be non-empty, without '\"'", param=param)


def _dsml_parameters(tokenizer, schema: dict, rule: str, param: str) -> tuple[str, list[str]]:
    """``(sequence, rules)``: the Lark sequence of a call's ``parameter`` elements (each with its newline)
    for the tool's ``schema``, and the rules it uses (named from ``rule``); see the module docstring."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return _dsml_free(tokenizer, schema, rule)
    required = schema.get("required")
    required = list(dict.fromkeys(key for key in required if isinstance(key, str))) if isinstance(required, list) else []
    names = list(properties) + [key for key in required if key not in properties]
    defs = _definitions(schema)
    parts, rules = [], []
    for number, key in enumerate(names):
        _check_dsml_name(key, f"{param}.properties")
        element = f"{rule}_{number}"
        rules += _dsml_element(tokenizer, element, key, properties.get(key, {}), defs)
        parts.append(element if key in required else f"{element}?")
    return " ".join(parts), rules


def _dsml_element(tokenizer, rule: str, key: str, schema, defs: dict) -> list[str]:
    """Rules for one ``parameter`` element named ``key``: raw text when ``schema`` allows only strings it
    can say exactly, else JSON of ``schema``."""
    raw = _raw_text(schema, f"{rule.upper()}_TEXT")
    if raw is not None:
        value, extra = raw
        return [f"{rule}: {_dsml_open(tokenizer, key, True)} {value} {_dsml_close(tokenizer)}", *extra]
    return [f"{rule}: {_dsml_open(tokenizer, key, False)} {rule}_json {_dsml_close(tokenizer)}", f"{rule}_json: %json {json.dumps(_json_value(schema, defs))}"]


def _dsml_free(tokenizer, schema: dict, rule: str) -> tuple[str, list[str]]:
    """Free-form parameters for a schema without ``properties``: any number, valued by its
    ``additionalProperties`` schema, else raw text or any JSON; none when that is false."""
    extra = schema.get("additionalProperties", True)
    if extra is False:
        return "", []
    defs = _definitions(schema)
    values = extra if isinstance(extra, dict) else {}
    text = f"{rule.upper()}_TEXT"
    raw = _raw_text(values, text) if values else (text, [f"{text}: /[^<]*/"])
    choices, rules = [], []
    if raw is not None:
        choices.append(_lark_string('true">') + " " + raw[0])
        rules += raw[1]
    if raw is None or not values:
        choices.append(_lark_string('false">') + f" {rule}_json")
        rules.append(f"{rule}_json: %json {json.dumps(_json_value(values, defs))}")
    name_open, name_close = _markup(tokenizer, f'<{DSML}parameter name="'), _markup(tokenizer, '" string="')
    rules.append(f"{rule}_free: {name_open} {FREE_NAME} {name_close} ({' | '.join(choices)}) {_dsml_close(tokenizer)}")
    return f"{rule}_free*", rules


def _definitions(schema: dict) -> dict:
    """The schema's ``$defs`` / ``definitions``, carried into each value's sub-schema so its ``$ref``s resolve."""
    return {key: schema[key] for key in ("$defs", "definitions") if key in schema}


def _dsml_open(tokenizer, key: str, string: bool) -> str:
    return _markup(tokenizer, f'<{DSML}parameter name="{key}" string="{"true" if string else "false"}">')


def _dsml_close(tokenizer) -> str:
    return _markup(tokenizer, f"</{DSML}parameter>\n")


def _raw_text(schema, terminal: str) -> tuple[str, list[str]] | None:
    """``(expression, rules)`` for a string value written as is (no ``<``, so the closing tag ends it), or
    None when ``schema`` allows more than strings or constrains them in a way a raw regex cannot say."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if isinstance(values, list) and values and all(isinstance(v, str) and "<" not in v for v in values):
            return "(" + " | ".join(_lark_string(v) for v in dict.fromkeys(values)) + ")", []
        return None
    if schema.get("type") != "string" or set(schema) - ANNOTATIONS - {"type", "minLength", "maxLength", "pattern"}:
        return None
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if not isinstance(low, int) or not (high is None or isinstance(high, int)):
        return None
    lexeme = "/[^<]*/" if not low and high is None else f"/[^<]{{{low},{'' if high is None else high}}}/"
    if "pattern" in schema:
        pattern = _anchored(schema["pattern"])
        if pattern is None:
            return None
        lexeme += f" & /{pattern}/"
    rule = f"{terminal}: {lexeme}"
    return (terminal, [rule]) if not _lark_error(f"%llguidance {{}}\nstart: {terminal}\n{rule}\n") else None


def _anchored(pattern) -> str | None:
    """A JSON-schema ``pattern`` anchored at both ends (``^…$``), as a Lark regex body; None otherwise (JSON
    patterns match anywhere, which the raw form would have to spell out)."""
    import llguidance

    if not isinstance(pattern, str) or not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
        return None
    body = pattern[1:-1]
    if "$" in body or re.search(r"(?<!\[)\^", body):  # an inner anchor (``^a$|^b$``): not one anchored whole
        return None
    try:
        return llguidance.regex_to_lark(body, "dw")  # JSON schema's \d and \w are ASCII
    except Exception:
        return None


def _json_value(schema, defs: dict) -> dict:
    """The ``%json`` schema of one value as the template renders it (``json.dumps``), with the tool schema's
    ``$defs`` so that its references resolve; any JSON where the piece does not compile on its own."""
    value = schema if isinstance(schema, dict) else {}
    value = {**defs, **value}
    if _schema_error(value):
        value = {}
    return {**value, "x-guidance": JSON_STYLE}


# ---------------------------------------------------------------------- Lark pieces


def _markup(tokenizer, text: str) -> str:
    """``text`` in Lark, its added (special) tokens as ``<[id]>``: llguidance never matches those as text."""
    added = sorted((t for t in tokenizer.get_added_vocab() if t and t in text), key=len, reverse=True)
    if not added:
        return _lark_string(text)
    pieces = re.split("(" + "|".join(map(re.escape, added)) + ")", text)
    return " ".join(_token(tokenizer, piece) if piece in added else _lark_string(piece) for piece in pieces if piece)


def _token(tokenizer, text: str) -> str:
    """``text`` in Lark: ``<[id]>`` when the tokenizer has it as one (added) token, else the literal."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return f"<[{ids[0]}]>" if len(ids) == 1 else _lark_string(text)


def _lark_string(text: str) -> str:
    return json.dumps(text)


class RawStream:
    """The stream parser's interface for a structured answer: all of it is content, nothing is parsed."""

    def __init__(self):
        self.sent = 0

    def feed(self, text: str) -> list[Delta]:
        new, self.sent = text[self.sent:], max(self.sent, len(text))
        return [Delta("content", new)] if new else []

    finish = feed
