"""The OpenAI Agents SDK against the proxy, unchanged but ``base_url``: memory across ``Runner.run`` calls.

An agent with one function tool (``get_weather``, declared with the demo model's schema) runs three
times on one conversation (``conversation_id``): the user says where they live; asks for the weather
(the model calls the tool, the SDK runs it and sends its output back, the model answers); asks where
they live, which the model answers from memory while its prompt holds only that question.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from e2e.proxies import DEMO_MODEL, demo_chat_format

from memt_demo.tool_turns import TOOLS

agents = pytest.importorskip("agents", reason="the Agents SDK is in the dev extra: pip install -e .[dev]")

pytestmark = pytest.mark.timeout(600)

SPEC = TOOLS["get_weather"]["function"]


def test_an_agent_with_a_function_tool_remembers_across_runs(demo_proxy):
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no network: traces would go to OpenAI
    client = AsyncOpenAI(base_url=demo_proxy.base_url, api_key="unused", max_retries=0)
    cities: list[str] = []

    async def get_weather(context, arguments: str) -> str:
        city = json.loads(arguments)["city"]
        cities.append(city)
        return json.dumps({"city": city, "temperature": 18, "condition": "cloudy"})

    tool = agents.FunctionTool(name=SPEC["name"], description=SPEC["description"], params_json_schema=SPEC["parameters"], on_invoke_tool=get_weather, strict_json_schema=False)
    agent = agents.Agent(name="assistant", model=agents.OpenAIResponsesModel(DEMO_MODEL, openai_client=client), tools=[tool])

    async def runs():
        conversation = await client.conversations.create()
        told = await agents.Runner.run(agent, "Hi! I live in Lisbon.", conversation_id=conversation.id)
        weather = await agents.Runner.run(agent, "What is the weather where I live?", conversation_id=conversation.id)
        asked = await agents.Runner.run(agent, "Where do I live?", conversation_id=conversation.id)
        items = await client.conversations.items.list(conversation.id, limit=100)
        await client.close()
        return told, weather, asked, items

    told, weather, asked, items = asyncio.run(runs())
    assert told.final_output
    assert len(cities) == 1, "the agent called its tool once"
    assert [response.output[0].type for response in weather.raw_responses] == ["function_call", "message"]
    assert weather.final_output
    assert "Lisbon" in asked.final_output, asked.final_output
    chat_format, tools = demo_chat_format(), [{"type": "function", "function": SPEC}]
    only_the_question = chat_format.bos_ids + chat_format.system_ids(None, tools) + chat_format.open_turn_ids([{"role": "user", "content": "Where do I live?"}], enable_thinking=False)
    assert asked.raw_responses[0].usage.input_tokens == len(only_the_question)  # earlier runs are in memory
    assert [item.type for item in items.data].count("function_call_output") == 1
