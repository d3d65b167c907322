"""``memt_proxy.chat.stream``: parser deltas as OpenAI ``delta`` objects, and a kept answer replayed for a client's
retry, as a body or as chunks that reassemble to the same message (tiny Nano checkpoint's real parser)."""

from __future__ import annotations

import asyncio

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_proxy.chat.stream import deltas as _deltas
from memt_proxy.chat.stream import replayed
from memt_proxy.protocol import ChatCompletionRequest


class Service:
    def __init__(self, parser):
        self.parser = parser


@pytest.fixture(scope="module")
def service(nano_checkpoint):
    _, parser = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))
    return Service(parser)


def test_stream_deltas_carry_indexes(service):
    text = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call><tool_call>\n{"name": "b", "arguments": {"x": 1}}\n</tool_call>'
    stream = service.parser.stream(thinking=False)
    deltas = []
    for end in range(1, len(text) + 1):
        deltas += list(_deltas(stream.feed(text[:end]), True))
    deltas += list(_deltas(stream.finish(text), True))
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [(c["index"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [(0, "a", "{}"), (1, "b", '{"x": 1}')]
    stream = service.parser.stream(thinking=False)
    single = list(_deltas(stream.finish(text), False))  # parallel_tool_calls false: only the first call
    assert [d["tool_calls"][0]["index"] for d in single if "tool_calls" in d] == [0]


def test_a_kept_answer_is_replayed_as_the_same_message_body_or_chunks():
    kept = {
        "message": {"role": "assistant", "content": "Sunny.", "reasoning_content": "check",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        "finish": "tool_calls",
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
    ask = {"model": "m", "messages": [{"role": "user", "content": "weather?"}]}
    body = replayed(ChatCompletionRequest.model_validate(ask), kept)
    assert body["choices"][0]["message"] == kept["message"] and body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"]["total_tokens"] == 8

    async def chunks():
        streamed = ChatCompletionRequest.model_validate({**ask, "stream": True, "stream_options": {"include_usage": True}})
        return [chunk async for chunk in replayed(streamed, kept)]

    got = asyncio.run(chunks())
    message: dict = {}
    for chunk in got[:-1]:
        delta = chunk["choices"][0]["delta"]
        for key in ("role", "content", "reasoning_content"):
            if delta.get(key):
                message[key] = message.get(key, "") + delta[key]
        for call in delta.get("tool_calls") or []:
            message.setdefault("tool_calls", []).append({k: v for k, v in call.items() if k != "index"})
    assert message == kept["message"]
    assert got[-2]["choices"][0]["finish_reason"] == "tool_calls" and got[-1]["usage"]["total_tokens"] == 8
