"""``ChatMemT`` against a live MemT proxy and core with the real ``langchain-openai`` stack."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from adapter_live import MODEL, WEATHER, run_example
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from langchain_memt import ChatMemT

pytestmark = pytest.mark.timeout(600)


def llm(proxy, session=None, memory=None, **kwargs):
    return ChatMemT(model=MODEL, base_url=proxy.base_url, session_id=session, memory=memory, temperature=0, max_tokens=48, **kwargs)


def session_name() -> str:
    return f"lc-{uuid.uuid4().hex[:8]}"


def test_headers_are_fields(demo_proxy):
    proxy = demo_proxy
    chat = llm(proxy, "alice", "read")
    assert chat.default_headers == {"X-MemT-Session": "alice", "X-MemT-Memory": "read"}
    assert llm(proxy).default_headers == {}


def test_invoke_and_stream_on_one_session_use_memory(demo_proxy):
    proxy = demo_proxy
    session = session_name()
    chat = llm(proxy, session, "auto")
    history = [HumanMessage("Hi, my name is Alice and I live in Lisbon.")]
    reply = chat.invoke(history)
    assert isinstance(reply, AIMessage) and reply.content
    info = proxy.inspect(session, None)
    assert info["committed_messages"] == 2  # the header reached the proxy: the turn was committed

    history += [reply, HumanMessage("What is my name?")]
    pieces = list(chat.stream(history))
    streamed = "".join(piece.content for piece in pieces)
    assert "Alice" in streamed
    # the proxy trimmed the resent history: only the new question was sent to the model
    assert proxy.inspect(session, None)["committed_messages"] == 4


def test_memory_off_and_read_headers(demo_proxy):
    proxy = demo_proxy
    session = session_name()
    llm(proxy, session, "auto").invoke([HumanMessage("My name is Omar.")])
    assert proxy.inspect(session, None)["committed_messages"] == 2
    answer = llm(proxy, session, "read").invoke([HumanMessage("What is my name?")]).content
    assert "Omar" in answer
    assert proxy.inspect(session, None)["committed_messages"] == 2  # read: nothing new committed
    answer_off = llm(proxy, session, "off").invoke([HumanMessage("What is my name?")]).content
    assert "Omar" not in answer_off  # off: memory not read


def test_two_instances_with_different_sessions_stay_separate(demo_proxy):
    proxy = demo_proxy
    first, second = session_name(), session_name()
    llm(proxy, first, "auto").invoke([HumanMessage("My name is Alice.")])
    llm(proxy, second, "auto").invoke([HumanMessage("My name is Victor.")])
    answer_first = llm(proxy, first).invoke([HumanMessage("What is my name?")]).content
    answer_second = llm(proxy, second).invoke([HumanMessage("What is my name?")]).content
    assert "Alice" in answer_first and "Victor" not in answer_first
    assert "Victor" in answer_second and "Alice" not in answer_second


def test_bind_tools_round_trip(demo_proxy):
    proxy = demo_proxy
    chat = llm(proxy, session_name(), "auto").bind_tools([WEATHER])
    question = HumanMessage("What is the weather in Paris?")
    first = chat.invoke([question])
    assert len(first.tool_calls) == 1 and first.tool_calls[0]["name"] == "get_weather"
    call = first.tool_calls[0]
    result = json.dumps({"city": call["args"].get("city", "Paris"), "temperature": 21, "condition": "sunny"})
    final = chat.invoke([question, first, ToolMessage(result, tool_call_id=call["id"])])
    assert not final.tool_calls and "21" in final.content


def test_ainvoke_and_astream(demo_proxy):
    proxy = demo_proxy
    chat = llm(proxy, session_name(), "auto")
    told = HumanMessage("Hi, I am Emma and my favourite food is pizza.")

    async def run():
        reply = await chat.ainvoke([told])
        pieces = [piece.content async for piece in chat.astream([told, reply, HumanMessage("What is my favourite food?")])]
        return reply, "".join(pieces)

    reply, streamed = asyncio.run(run())
    assert reply.content
    assert "pizza" in streamed


def test_session_admin_helpers(demo_proxy):
    proxy = demo_proxy
    session = session_name()
    chat = llm(proxy, session, "auto")
    chat.invoke([HumanMessage("My name is Grace.")])
    name = chat.save_snapshot(f"{session}.safetensors")
    assert name == f"{session}.safetensors"
    chat.reset_memory()
    assert chat.inspect_session()["committed_messages"] == 0
    assert "Grace" not in chat.invoke([HumanMessage("What is my name?")]).content
    chat.restore_snapshot(name)
    assert "Grace" in chat.invoke([HumanMessage("What is my name?")]).content
    assert chat.close_session() == {"closed": True}


def test_example_runs(demo_proxy):
    output = run_example("langchain_chat.py", demo_proxy)
    assert "model:" in output
    assert "memory: 4 messages committed" in output  # both turns were written into the session's memory
