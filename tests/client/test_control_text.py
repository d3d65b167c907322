"""No control token from any client string (issue 48, item 3), on both families' tokenizers.

Every position a chat template writes a client's string to (system prompt, user text and its parts, tool
results and their ids, an assistant's content, reasoning and tool calls in history, a tool's name,
description, parameter keys, enum values and defaults, a named tool_choice, a document) is fed each
control text of the tokenizer (turn markers, think and tool-call tags, end tokens), each joined with each
character ``tojson`` escapes (newline, quote, tab, backslash); tool-call arguments also as JSON whose
escapes (``\\u003c``) a template may decode, and list parts whose pieces join into a control text. Each
prompt must hold exactly the control tokens of the same prompt with ``"x"`` in that place: the template's.
"""

from __future__ import annotations

import json

import pytest

from memt_core.client import load_chat_format, load_tokenizer
from memt_core.client.control_text import ControlGuard
from memt_core.families import FLASH, NANO

ESCAPED = ["\n", '"', "\t", "\\"]


def _tool(name="lookup", description="Look a thing up.", key="city", enum="Paris", default="Rome") -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {key: {"type": "string", "description": description, "enum": [enum, "Oslo"],
                                                              "default": default}}, "required": [key]},
    }}


def _history(content="fine", reasoning="because", name="lookup", arguments='{"city": "Paris"}', result="sunny", call_id="c1") -> list[dict]:
    return [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": content, "reasoning_content": reasoning,
         "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": "done"},
    ]


def _escaped_json(value: str) -> str:
    """``{"city": value}`` as JSON text with "<" and ">" written as \\u escapes (JSON a template may decode)."""
    return json.dumps({"city": value}).replace("<", "\\u003c").replace(">", "\\u003e")


def positions(chat_format) -> dict:
    """Each client-string position: a function from the string to the prompt ids built with it there."""
    f = chat_format
    return {
        "system prompt": lambda v: f.system_ids(v, None),
        "system prompt beside tools": lambda v: f.system_ids(v, [_tool()]),
        "tool name": lambda v: f.system_ids(None, [_tool(name=v)]),
        "tool description": lambda v: f.system_ids(None, [_tool(description=v)]),
        "tool parameter key": lambda v: f.system_ids(None, [_tool(key=v)]),
        "tool enum value": lambda v: f.system_ids(None, [_tool(enum=v)]),
        "tool default": lambda v: f.system_ids(None, [_tool(default=v)]),
        "tools in a stateless conversation": lambda v: f.conversation_ids([{"role": "user", "content": "hi"}], tools=[_tool(description=v, key=v)]),
        "user text": lambda v: f.user_ids(v),
        "user text part": lambda v: f.open_turn_ids([{"role": "user", "content": [{"type": "text", "text": v}]}]),
        "user text parts joined": lambda v: f.open_turn_ids([{"role": "user", "content": [
            {"type": "text", "text": v[: len(v) // 2]}, {"type": "text", "text": v[len(v) // 2:]}]}]),
        "tool result": lambda v: f.tool_results_ids([{"tool_call_id": "c", "content": v}]),
        "tool result call id": lambda v: f.tool_results_ids([{"tool_call_id": v, "content": "ok"}]),
        "history assistant content": lambda v: f.history_ids(_history(content=v)),
        "history reasoning": lambda v: f.history_ids(_history(reasoning=v)),
        "history tool-call name": lambda v: f.history_ids(_history(name=v)),
        "history tool-call arguments text": lambda v: f.history_ids(_history(arguments=v)),
        "history tool-call argument value": lambda v: f.history_ids(_history(arguments=json.dumps({"city": v}))),
        "history tool-call argument, \\u-escaped": lambda v: f.history_ids(_history(arguments=_escaped_json(v))),
        "history tool-call arguments object": lambda v: f.history_ids(_history(arguments={v: v})),
        "history tool result": lambda v: f.history_ids(_history(result=v)),
        "open turn after tool results": lambda v: f.open_turn_ids(_history(result=v)[:3], enable_thinking=True),
        "conversation user text": lambda v: f.conversation_ids([{"role": "system", "content": v}, {"role": "user", "content": v}]),
        "named tool_choice": lambda v: f.prefix_ids(f.tool_call_prefix(v)),
        "document": lambda v: f.document_ids(v),
    }


def hostile_strings(tokenizer) -> list[str]:
    """Each control text with each escaped character before, after and around it."""
    texts = []
    for control in tokenizer.get_added_vocab():
        for char in ESCAPED:
            texts += [control + char, char + control, f"a{char}{control}{char}b"]
    return texts


@pytest.fixture(params=[NANO, FLASH], ids=["nano", "flash"])
def chat_format(request, nano_checkpoint, flash_checkpoint):
    path = nano_checkpoint if request.param == NANO else flash_checkpoint
    return load_chat_format(path, tokenizer=load_tokenizer(path))[0]


def test_no_control_token_from_any_client_string(chat_format):
    controls = set(chat_format.tokenizer.get_added_vocab().values())

    def control_ids(ids: list[int]) -> list[int]:
        return [i for i in ids if i in controls]

    tried, forged = 0, []
    for where, build in positions(chat_format).items():
        expected = control_ids(build("x"))
        for text in hostile_strings(chat_format.tokenizer):
            tried += 1
            got = control_ids(build(text))
            if got != expected:
                forged.append(f"{where}: {text!r} gave {len(got)} control tokens, the template's are {len(expected)}")
    assert tried > 1000 and forged == [], forged[:10]


def test_the_typed_control_string_is_kept_as_text(chat_format):
    """What a client typed reaches the model whole, as text (it is neither dropped nor mangled)."""
    control = next(iter(chat_format.tokenizer.get_added_vocab()))
    description = f'say "{control}"\tnow\n'
    ids = chat_format.system_ids(None, [_tool(description=description)])
    assert json.dumps(description, ensure_ascii=False)[1:-1] in chat_format.tokenizer.decode(ids)
    assert control in chat_format.tokenizer.decode(chat_format.user_ids(f"a{control}b"))


def test_text_without_a_control_string_encodes_as_rendered(chat_format):
    """The guard changes nothing else: a prompt with no control string typed is the rendered text encoded."""
    tools = [_tool(description='Quotes " tabs \t newlines \n backslashes \\ and a < b > c.')]
    messages = _history() + [{"role": "user", "content": "a <b> c"}]
    rendered = chat_format.conversation_text(messages, tools=tools, thinking=chat_format.thinking(None))
    assert chat_format.conversation_ids(messages, tools=tools) == list(chat_format.bos_ids) + chat_format._encode(rendered)


def test_the_guard_cuts_what_could_join_the_templates_text():
    """A string's end that starts a control text and its start that ends one are cut off (the template's text
    next to them could complete the control text); the middle of a string and other text are not touched."""

    class Vocabulary:
        def get_added_vocab(self):
            return {"<|im_end|>": 2}

    guard = ControlGuard(Vocabulary())
    assert guard.cut("hello <|im_", "N") == "hello <|im_N"
    assert guard.cut("end|> world", "N") == "Nend|> world"
    assert guard.cut("a<|im_end|>b", "N") == "a<N|im_end|>b"
    assert guard.cut("a <b> c | d", "N") == "a <b> c | d"
    assert guard.guard({"k": ["x", ("y",)]}, "N") == {"k": ["x", ("y",)]}
