"""Tool calling through the OpenAI-compatible proxy, live, with the official ``openai`` SDK.

A random checkpoint never writes a well-formed tool call, so these tests use the bundled demo model
(``memt_core/bundled/memt-tiny-demo``, trained by ``scripts/train_tiny.py`` to call ``get_weather`` /
``add`` / ``multiply`` in the format of :mod:`memt_demo`). Without it they FAIL (not skip): tool
calling end to end is a requirement of the proxy.

Covered: two rounds (call → tool result → final answer), streamed and not; the follow-up request
continues the pending turn with the model's exact tokens; the turn is committed after its final
answer; streamed tool-call deltas reassemble (by ``index``) into the non-streamed calls; a pending call
followed by a new user message gets 400 ``tool_results_missing``; tool_choice none/required/named.
"""

from __future__ import annotations

import json

import openai
import pytest
from e2e.proxies import DEMO_MODEL, assert_openai_error, demo_chat_format, unique

from memt_demo.tool_turns import TOOLS

pytestmark = pytest.mark.timeout(600)

DEMO = DEMO_MODEL
WEATHER_TOOLS = [TOOLS["get_weather"], TOOLS["add"]]
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
RESULT = json.dumps({"city": "Paris", "temperature": 21, "condition": "sunny"})


@pytest.fixture(scope="module")
def demo(demo_proxy):
    return demo_proxy


@pytest.fixture(scope="module")
def client(demo):
    return demo.openai("unused")


def chat(client, messages, session=None, **kwargs):
    headers = {"X-MemT-Session": session} if session else {}
    kwargs.setdefault("tools", WEATHER_TOOLS)
    return client.chat.completions.create(model=DEMO, messages=messages, temperature=0.0, max_tokens=64, extra_headers=headers, **kwargs)


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def weather_call(calls: list[tuple[str, dict]]) -> bool:
    """Exactly one well-formed get_weather call (its city is the model's business, not the proxy's)."""
    return len(calls) == 1 and calls[0][0] == "get_weather" and set(calls[0][1]) == {"city"} and isinstance(calls[0][1]["city"], str)


def assistant_call(message) -> dict:
    return {
        "role": "assistant", "content": message.content,
        "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}} for c in message.tool_calls],
    }


def reassemble(chunks) -> tuple[str, list[tuple[str, dict]], list[str], str | None]:
    """(content, calls by index, call ids, finish_reason) from streamed chunks, as OpenAI clients do."""
    content, calls, finish = [], {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content.append(choice.delta.content or "")
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = delta.id or entry["id"]
            if delta.function is not None:
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    assert sorted(calls) == list(range(len(calls))), f"tool-call indexes must be 0..n-1, got {sorted(calls)}"
    ordered = [calls[i] for i in sorted(calls)]
    return "".join(content), [(c["name"], json.loads(c["arguments"])) for c in ordered], [c["id"] for c in ordered], finish


def test_two_rounds_non_streaming(demo, client):
    session = unique("tools")
    first = chat(client, [QUESTION], session, tool_choice="auto")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert weather_call(calls_of(choice.message))
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    info = demo.inspect(session, None)
    assert info["pending_tool_calls"] is True and info["committed_messages"] == 0

    messages = [QUESTION, assistant_call(choice.message), {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    second = chat(client, messages, session, tool_choice="auto")
    final = second.choices[0]
    assert final.finish_reason == "stop", final
    assert not final.message.tool_calls and final.message.content
    # the follow-up continued the pending turn: its prompt is the first prompt + the call's tokens + the results
    results_ids = demo_chat_format().tool_results_ids([{"tool_call_id": call.id, "content": RESULT}], enable_thinking=False)
    assert second.usage.prompt_tokens == first.usage.prompt_tokens + first.usage.completion_tokens + len(results_ids)
    info = demo.inspect(session, None)
    assert info["pending_tool_calls"] is False and info["committed_messages"] == 4  # committed after the final answer

    # the next turn resends everything; the committed tool round is trimmed away
    follow = messages + [{"role": "assistant", "content": final.message.content}, {"role": "user", "content": "What is 2 plus 3?"}]
    third = chat(client, follow, session, tool_choice="auto")
    assert third.usage.prompt_tokens == first.usage.prompt_tokens - len(demo_chat_format().user_ids(QUESTION["content"], enable_thinking=False)) \
        + len(demo_chat_format().user_ids(follow[-1]["content"], enable_thinking=False))


def test_streamed_calls_equal_non_streamed(demo, client):
    whole = chat(client, [QUESTION], tool_choice="auto")
    chunks = list(chat(client, [QUESTION], tool_choice="auto", stream=True, stream_options={"include_usage": True}))
    content, calls, ids, finish = reassemble(chunks)
    assert finish == "tool_calls" == whole.choices[0].finish_reason
    assert calls == calls_of(whole.choices[0].message) and weather_call(calls)
    assert all(i and i.startswith("call_") for i in ids)
    assert content == (whole.choices[0].message.content or "")
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_two_rounds_streaming(demo, client):
    session = unique("tools-stream")
    content, calls, ids, finish = reassemble(chat(client, [QUESTION], session, tool_choice="auto", stream=True))
    assert finish == "tool_calls" and weather_call(calls)
    call_message = {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": ids[0], "type": "function", "function": {"name": calls[0][0], "arguments": json.dumps(calls[0][1])}}
    ]}
    messages = [QUESTION, call_message, {"role": "tool", "tool_call_id": ids[0], "content": RESULT}]
    answer, more_calls, _, finish = reassemble(chat(client, messages, session, tool_choice="auto", stream=True))
    assert finish == "stop" and not more_calls and answer
    # the same two rounds without streaming on a fresh session give the same final answer
    reference = unique("tools-ref")
    first = chat(client, [QUESTION], reference, tool_choice="auto")
    ref_messages = [QUESTION, assistant_call(first.choices[0].message),
                    {"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id, "content": RESULT}]
    assert chat(client, ref_messages, reference, tool_choice="auto").choices[0].message.content == answer
    assert demo.inspect(session, None)["committed_messages"] == 4


def test_pending_call_then_new_user_message(demo, client):
    session = unique("tools-pending")
    first = chat(client, [QUESTION], session, tool_choice="auto")
    assert first.choices[0].finish_reason == "tool_calls"
    skipped = [QUESTION, assistant_call(first.choices[0].message), {"role": "user", "content": "Never mind, what is 2 plus 2?"}]
    with demo.http(None) as http:
        response = http.post("/v1/chat/completions", json={"model": DEMO, "messages": skipped, "tools": WEATHER_TOOLS},
                             headers={"X-MemT-Session": session})
        error = assert_openai_error(response, 400, type="invalid_request_error", code="tool_results_missing", param="messages")
        assert first.choices[0].message.tool_calls[0].id in error["message"]
    with pytest.raises(openai.BadRequestError):
        chat(client, skipped, session, tool_choice="auto", stream=True)
    assert demo.inspect(session, None)["pending_tool_calls"] is True  # the refusal changed nothing
    call = first.choices[0].message.tool_calls[0]
    answered = chat(client, [QUESTION, assistant_call(first.choices[0].message), {"role": "tool", "tool_call_id": call.id, "content": RESULT}], session)
    assert answered.choices[0].finish_reason == "stop"


def test_tool_choice_modes(client):
    none = chat(client, [QUESTION], tool_choice="none")
    assert not none.choices[0].message.tool_calls and none.choices[0].finish_reason != "tool_calls"
    required = chat(client, [QUESTION], tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls"
    assert calls_of(required.choices[0].message)[0][0] == "get_weather"
    named = chat(client, [{"role": "user", "content": "What is 3 plus 4?"}], tool_choice={"type": "function", "function": {"name": "add"}})
    assert named.choices[0].finish_reason == "tool_calls", named.choices[0].message
    name, arguments = calls_of(named.choices[0].message)[0]
    assert name == "add" and set(arguments) == {"a", "b"}
    streamed = reassemble(chat(client, [{"role": "user", "content": "What is 3 plus 4?"}], tool_choice={"type": "function", "function": {"name": "add"}}, stream=True))
    assert streamed[1] == calls_of(named.choices[0].message) and streamed[3] == "tool_calls"
