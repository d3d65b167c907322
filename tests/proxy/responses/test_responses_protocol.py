"""Responses API wire shapes without a server: request checks, input items → chat messages, response
objects and stream events as the official ``openai`` SDK's typed models validate them, cursor pages. Streamed items:
``test_responses_stream.py``."""

from __future__ import annotations

import pytest
from openai.types.conversations import Conversation, ConversationItemList
from openai.types.responses import Response, ResponseItemList

from memt_proxy.errors import ProxyError
from memt_proxy.responses.protocol import (
    InputItems, ResponseRequest, conversation_object, function_call_item, item_list, message_item, reasoning_item,
    response_object, usage,
)

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def request(**fields) -> ResponseRequest:
    return ResponseRequest.model_validate({"model": "m", "input": "hi", **fields})


def refusal(**fields) -> ProxyError:
    with pytest.raises(ProxyError) as refused:
        request(**fields).checked()
    assert refused.value.status == 400
    return refused.value


def test_what_cannot_be_honoured_is_refused_naming_the_field():
    assert refusal(conversation="conv_a", previous_response_id="resp_b").param == "previous_response_id"
    assert refusal(tools=[{"type": "file_search"}]).code == "unsupported_tool"
    assert refusal(input=[{"type": "web_search_call"}]).param == "input[0].type"
    assert refusal(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]).code == "unsupported_content"
    assert refusal(tools=[TOOL], tool_choice={"type": "function", "name": "other"}).param == "tool_choice"
    assert refusal(tool_choice={"type": "web_search"}).code == "invalid_tool_choice"
    assert refusal(background=True).param == "background"
    assert refusal(text={"format": {"type": "json_schema", "name": "x", "schema": "{}"}}).param == "text.format"
    assert refusal(text={"format": {"type": "xml"}}).code == "unsupported_parameter"
    assert refusal(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]).param == "input[0].call_id"


def test_harmless_unknown_fields_are_reported_not_refused():
    assert request(include=["x"], truncation="auto", something=1, text={"format": {"type": "text"}, "verbosity": "low"}).checked() == ["include", "truncation", "something"]
    assert request(include=["message.output_text.logprobs"]).checked() == [] and request(include=["message.output_text.logprobs"]).logprobs
    assert request(conversation={"id": "conv_a"}).conversation_id == "conv_a"
    assert request(tools=[TOOL], tool_choice="none").chat_tools() is None
    assert request(tools=[TOOL]).chat_tools() == [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL["parameters"]}}]


def test_input_items_become_chat_messages():
    items = InputItems.of([
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "weather in "}, {"type": "input_text", "text": "Oslo?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "reasoning", "summary": []},
    ])
    assert items.messages() == [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]
    assert len({item["id"] for item in items.items}) == len(items.items)  # every stored item has its own id
    assert InputItems.of("hello").messages() == [{"role": "user", "content": "hello"}]


def test_the_sdk_validates_every_object():
    output = [reasoning_item("thinking"), message_item("Hello"), function_call_item(CALL)]
    for status, incomplete in (("completed", None), ("incomplete", "max_output_tokens"), ("in_progress", None)):
        body = response_object(request(tools=[TOOL], conversation="conv_a", metadata={"k": "v"}), response_id="resp_1", created_at=1, status=status, output=output, usage=usage(10, 3), incomplete=incomplete)
        parsed = Response.model_validate(body)  # strict validation, not the SDK's lenient construct
        assert parsed.output_text == "Hello" and parsed.usage.input_tokens == 10 and parsed.status == status
    items = InputItems.of([{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c", "output": "x"}]).items
    ResponseItemList.model_validate(item_list(items, after=None, limit=20, order="asc"))
    ConversationItemList.model_validate(item_list(items + output, after=None, limit=20, order="asc"))
    Conversation.model_validate(conversation_object("conv_a", 1, None))


def test_item_pages_follow_the_cursor():
    items = [{"id": f"i{n}"} for n in range(5)]
    page = item_list(items, after=None, limit=2, order="asc")
    assert [i["id"] for i in page["data"]] == ["i0", "i1"] and page["has_more"] and page["last_id"] == "i1"
    page = item_list(items, after="i1", limit=10, order="asc")
    assert [i["id"] for i in page["data"]] == ["i2", "i3", "i4"] and not page["has_more"]
    assert [i["id"] for i in item_list(items, after=None, limit=2, order="desc")["data"]] == ["i4", "i3"]
    with pytest.raises(ProxyError):
        item_list(items, after="nope", limit=2, order="asc")
