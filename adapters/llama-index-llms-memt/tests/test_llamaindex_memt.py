"""``llama_index.llms.memt.MemT`` against a live MemT proxy and core with the real LlamaIndex stack."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from adapter_live import MODEL, WEATHER, run_example
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool

from llama_index.llms.memt import MemT

pytestmark = pytest.mark.timeout(600)


def llm(proxy, session=None, memory=None):
    return MemT(model=MODEL, api_base=proxy.base_url, session_id=session, memory=memory, temperature=0, max_tokens=48)


def session_name() -> str:
    return f"li-{uuid.uuid4().hex[:8]}"


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def test_chat_and_stream_chat_use_memory(demo_proxy):
    proxy = demo_proxy
    session = session_name()
    model = llm(proxy, session, "auto")
    history = [user("Hi, my name is Kenji and I live in Oslo.")]
    reply = model.chat(history)
    assert reply.message.content
    assert proxy.inspect(session, None)["committed_messages"] == 2
    history += [reply.message, user("Where do I live?")]
    streamed = "".join(piece.delta or "" for piece in model.stream_chat(history))
    assert "Oslo" in streamed


def test_async_variants(demo_proxy):
    proxy = demo_proxy
    model = llm(proxy, session_name(), "auto")

    async def run():
        reply = await model.achat([user("My name is Laura.")])
        pieces = []
        async for piece in await model.astream_chat([user("My name is Laura."), reply.message, user("What is my name?")]):
            pieces.append(piece.delta or "")
        return reply, "".join(pieces)

    reply, streamed = asyncio.run(run())
    assert reply.message.content
    assert "Laura" in streamed


def test_sessions_stay_separate(demo_proxy):
    proxy = demo_proxy
    first, second = session_name(), session_name()
    llm(proxy, first, "auto").chat([user("My name is Nina.")])
    llm(proxy, second, "auto").chat([user("My name is Hugo.")])
    one = llm(proxy, first).chat([user("What is my name?")]).message.content
    two = llm(proxy, second).chat([user("What is my name?")]).message.content
    assert "Nina" in one and "Hugo" not in one
    assert "Hugo" in two and "Nina" not in two


def test_function_calling_round_trip(demo_proxy):
    proxy = demo_proxy
    seen = []

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return json.dumps({"city": city, "temperature": 21, "condition": "sunny"})

    # the tiny demo model was trained on this tool's schema: describe it the same way
    tool = FunctionTool.from_defaults(fn=get_weather, name="get_weather", description=WEATHER["function"]["description"])
    model = llm(proxy, session_name(), "auto")
    # tool_required → tool_choice "required": the proxy opens the call for the model
    response = model.chat_with_tools([tool], user_msg="What is the weather in Paris?", tool_required=True)
    calls = model.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert len(calls) == 1 and calls[0].tool_name == "get_weather"
    output = tool(**calls[0].tool_kwargs)
    assert seen
    history = [user("What is the weather in Paris?"), response.message,
               ChatMessage(role="tool", content=str(output), additional_kwargs={"tool_call_id": calls[0].tool_id, "name": "get_weather"})]
    final = model.chat_with_tools([tool], chat_history=history)
    assert not model.get_tool_calls_from_response(final, error_on_no_tool_call=False)
    assert "21" in final.message.content


def test_example_runs(demo_proxy):
    output = run_example("llamaindex_chat.py", demo_proxy)
    assert "model:" in output
    assert "memory: 4 messages committed" in output  # both turns were written into the session's memory


def test_session_admin_helpers(demo_proxy):
    proxy = demo_proxy
    session = session_name()
    model = llm(proxy, session, "auto")
    model.chat([user("Hi, my name is Kenji.")])
    assert model.inspect_session()["committed_messages"] == 2
    name = model.save_snapshot(f"{session}.safetensors")
    model.reset_memory()
    assert "Kenji" not in model.chat([user("What is my name?")]).message.content
    model.restore_snapshot(name)
    assert "Kenji" in model.chat([user("What is my name?")]).message.content
    assert model.close_session() == {"closed": True}
    with pytest.raises(ValueError, match="session_id"):
        llm(proxy).inspect_session()
