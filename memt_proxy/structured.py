"""Structured outputs: the grammar a request's answer must follow, as one native sampling field.

* ``response_format`` ``json_schema`` / ``json_object`` → ``json_schema`` (the answer is the JSON itself).
* A forced tool call (``tool_choice`` required or named) on a chat format whose calls are JSON
  (``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``) → an llguidance Lark grammar sent as
  ``ebnf`` (``%llguidance``, see ``memt_core.grammar``): the rest of the call after the forced prefix,
  its arguments constrained to the tool's ``parameters`` schema, then the closing markup.
* ``response_format`` with tools the model may call (``tool_choice`` auto) → Lark: the JSON answer, or
  one such call.

A format whose calls are not JSON (DSML) gets no grammar for its calls. Schemas are checked here with
llguidance, so a bad one is a 400 naming the request field rather than an upstream error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from memt_proxy.errors import ProxyError

#: JSON as the chat templates render it (``json.dumps``): what the model saw in tool calls.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
JSON_CALL_PREFIX = '<tool_call>\n{"name": "f", "arguments":'


@dataclass(frozen=True)
class Structure:
    """The native grammar field and its source; ``raw``: the answer is the JSON itself (no markup to parse)."""

    field: str  # "json_schema" or "ebnf"
    source: str
    raw: bool


def check_schema(schema: dict, param: str) -> None:
    """A 400 naming ``param`` when llguidance cannot compile ``schema``."""
    import llguidance

    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False}))
    except Exception as exc:  # llguidance reports unusable schemas as plain exceptions
        error = str(exc) or type(exc).__name__
    if error:
        raise ProxyError(400, f"{param}: the JSON schema is not supported: {error[:300]}", param=param, code="invalid_schema")


def structure(chat_format, *, schema: dict | None, schema_param: str, tools: list[dict] | None, tools_param: str, forced: bool, name: str | None) -> Structure | None:
    """The grammar for a request: ``schema`` of the answer (or None), the tools offered (chat shape,
    ``{"type": "function", "function": {...}}``), whether a call is forced (``name``: that tool)."""
    if schema is not None:
        check_schema(schema, schema_param)
    json_calls = chat_format.tool_call_prefix("f") == JSON_CALL_PREFIX
    if forced and tools:
        if not json_calls:
            return None
        calls = _call_rules(chat_format, tools, tools_param, name)
        return Structure("ebnf", f"%llguidance {{}}\nstart: {calls[0]}\n" + "\n".join(calls[1:]) + "\n", raw=False)
    if schema is None:
        return None
    if not tools or not json_calls:
        return Structure("json_schema", json.dumps(schema), raw=True)
    calls = _call_rules(chat_format, tools, tools_param, None)
    opening = _token(chat_format.tokenizer, "<tool_call>")
    rules = [
        "start: answer | call",
        f"answer: %json {json.dumps({**schema, 'x-guidance': {'whitespace_flexible': False}})}",
        f'call: {opening} "\\n{{\\"name\\": \\"" ({calls[0]})',
        *calls[1:],
    ]
    return Structure("ebnf", "%llguidance {}\n" + "\n".join(rules) + "\n", raw=False)


def _call_rules(chat_format, tools: list[dict], tools_param: str, name: str | None) -> list[str]:
    """``[alternatives, rule, …]``: the text after ``JSON_CALL_PREFIX``'s name quote (or, for ``name``, after
    its ``"arguments":``) up to and including ``</tool_call>``, one alternative per tool."""
    closing = _token(chat_format.tokenizer, "</tool_call>")
    alternatives, rules = [], []
    for index, tool in enumerate(tools):
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        if not isinstance(parameters, dict):
            raise ProxyError(400, "a tool's parameters must be a JSON schema object", param=f"{tools_param}[{index}].function.parameters")
        check_schema(parameters, f"{tools_param}[{index}].function.parameters")
        head = "" if name is not None else _lark_string(function["name"] + '", "arguments":') + " "
        alternatives.append(f"call{index}")
        rules.append(f'call{index}: {head}" " args{index} "}}\\n" {closing}')
        rules.append(f"args{index}: %json {json.dumps({**parameters, 'x-guidance': JSON_STYLE})}")
    return [" | ".join(alternatives)] + rules


def _token(tokenizer, text: str) -> str:
    """``text`` in Lark: ``<[id]>`` when the tokenizer has it as one (added) token, else the literal."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return f"<[{ids[0]}]>" if len(ids) == 1 else _lark_string(text)


def _lark_string(text: str) -> str:
    return json.dumps(text)
