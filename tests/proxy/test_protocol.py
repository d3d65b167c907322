"""Request validation of the proxy's OpenAI wire models, and the response/chunk shapes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from memt_proxy.errors import ProxyError
from memt_proxy.protocol import ChatCompletionRequest, NamedToolChoice, Usage, chunk_body, response_body, text_of

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({**BASE, **fields})


def refused(**fields) -> ProxyError:
    with pytest.raises(ProxyError) as info:
        request(**fields).validate_semantics()
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value


def test_supported_fields_pass():
    r = request(
        temperature=0.7, top_p=0.9, max_tokens=16, stop=["\n"], seed=3, stream=True, stream_options={"include_usage": True},
        tools=[TOOL], tool_choice="auto", parallel_tool_calls=False, user="u", reasoning_effort="low",
        chat_template_kwargs={"enable_thinking": False}, n=2, logprobs=True, top_logprobs=3, response_format={"type": "text"},
        presence_penalty=1.5, frequency_penalty=-2.0, logit_bias={"12": -100, "7": 5.5}, top_k=40, min_p=0.1, repetition_penalty=1.1,
    )
    assert r.validate_semantics() == ["user"]  # accepted, changes nothing here: reported for logging
    assert r.max_new_tokens == 16 and r.stream_options.include_usage


def test_unknown_fields_are_ignored_and_reported():
    r = request(some_future_field=1, metadata={"k": "v"}, store=True)
    assert r.validate_semantics() == ["metadata", "some_future_field", "store"]


def test_max_completion_tokens():
    assert request(max_completion_tokens=9).max_new_tokens == 9
    assert request(max_tokens=9, max_completion_tokens=9).max_new_tokens == 9
    assert request().max_new_tokens is None
    assert refused(max_tokens=9, max_completion_tokens=8).param == "max_completion_tokens"


@pytest.mark.parametrize("fields,param,code", [
    ({"top_logprobs": 2}, "top_logprobs", None),  # without logprobs: true
    ({"response_format": {"type": "grammar"}}, "response_format", "unsupported_parameter"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}}, "response_format", None),
    ({"response_format": {"type": "json_schema"}}, "response_format", None),
    ({"logit_bias": {"a": 2}}, "logit_bias", None),
    ({"logit_bias": {"9" * 5000: 2}}, "logit_bias", None),  # (past int()'s digit limit: a 400, not a 500)
    ({"logit_bias": {"1": 101}}, "logit_bias", None),
    ({"top_k": 0}, "top_k", None),
    ({"stop": ["x", ""]}, "stop", None),
    ({"modalities": ["audio"]}, "modalities", "unsupported_parameter"),
    ({"audio": {"voice": "x"}}, "audio", "unsupported_parameter"),
    ({"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ({"function_call": "auto"}, "functions", "unsupported_parameter"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}, "messages[0].content", "unsupported_content"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[1].content", "unsupported_content"),
    ({"tool_choice": "required"}, "tool_choice", None),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice", None),
    ({"tool_choice": {"type": "function", "function": {"name": "other"}}, "tools": [TOOL]}, "tool_choice", None),
])
def test_semantics_refused_naming_the_field(fields, param, code):
    error = refused(**fields)
    assert error.param == param and error.code == code
    assert error.body() == {"error": {"message": error.message, "type": "invalid_request_error", "param": param, "code": code}}


def test_tool_choice_accepted_forms():
    for choice in ("auto", "none", "required"):
        r = request(tools=[TOOL], tool_choice=choice)
        assert r.validate_semantics() == [] and r.tool_choice == choice
    named = request(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.validate_semantics() == []
    assert isinstance(named.tool_choice, NamedToolChoice) and named.tool_choice.function.name == "get_weather"
    bare = request(tool_choice="none")  # none without tools is harmless
    assert bare.validate_semantics() == [] and (bare.tool_choice, bare.tools) == ("none", None)


@pytest.mark.parametrize("fields,where", [
    ({"messages": []}, ("messages",)),
    ({"messages": [{"role": "robot", "content": "x"}]}, ("messages", 0, "role")),
    ({"messages": [{"content": "x"}]}, ("messages", 0, "role")),
    ({"temperature": 2.5}, ("temperature",)),
    ({"temperature": -0.1}, ("temperature",)),
    ({"top_p": 0}, ("top_p",)),
    ({"max_tokens": 0}, ("max_tokens",)),
    ({"max_completion_tokens": -3}, ("max_completion_tokens",)),
    ({"stop": 5}, ("stop",)),
    ({"tools": [{"type": "function"}]}, ("tools", 0, "function")),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, ("tools", 0, "type")),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]}, ("messages", 0, "tool_calls", 0, "id")),
])
def test_wire_validation(fields, where):
    with pytest.raises(ValidationError) as info:
        request(**fields)
    assert info.value.errors()[0]["loc"][: len(where)] == where


def test_model_is_required():
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"messages": BASE["messages"]})
    assert info.value.errors()[0]["loc"] == ("model",)


def test_text_of():
    assert text_of(None) == "" and text_of("a") == "a"
    assert text_of([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"


def test_response_and_chunk_shapes():
    usage = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    body = response_body(id="chatcmpl-x", model="m", message={"role": "assistant", "content": "hi"}, finish_reason="stop", usage=usage)
    assert body["object"] == "chat.completion" and isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop", "logprobs": None}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chunk = chunk_body(id="c", model="m", created=1, delta={"content": "h"})
    assert chunk == {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "h"}, "finish_reason": None, "logprobs": None}]}
    final = chunk_body(id="c", model="m", created=1, delta=None, usage=usage)
    assert final["choices"] == [] and final["usage"]["total_tokens"] == 5
