"""The demo model is trained on exactly the token ids that the client and the proxy send.

``memt_demo.format`` builds training prompts and commits itself (it also needs per-token loss
weights); these tests hold it equal to ``memt_core.client.chat_format.NanoChatFormat``, which
``MemTSession`` and ``memt_proxy`` use at serving time, on the bundled demo checkpoint.
"""

from __future__ import annotations

import random

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_demo import episodes as ep
from memt_demo import tool_turns
from memt_demo.format import DemoChatFormat
from memt_core.bundled import BUNDLED_MODEL


@pytest.fixture(scope="module")
def formats():
    tokenizer = load_tokenizer(BUNDLED_MODEL)
    serving, _ = load_chat_format(BUNDLED_MODEL, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False})
    return DemoChatFormat(tokenizer), serving


def test_turn_start_matches_the_client(formats):
    training, serving = formats
    for text in ("Hi, my name is Alice and I live in Lisbon.", "What is my name?", "Repeat exactly:\nhello there"):
        assert training.turn_prompt(text) == serving.user_ids(text, enable_thinking=False)


def test_query_prompt_matches_the_proxy(formats):
    """A trimmed proxy prompt (system block + open turn) equals the training query prompt."""
    training, serving = formats
    rng = random.Random(3)
    for _ in range(20):
        tools = [ep.TOOLS[name] for name in tool_turns.offered_tools(rng, "get_weather")] if rng.random() < 0.5 else None
        system = "You are a helpful assistant." if rng.random() < 0.5 else None
        user = ep.question_message(rng, [ep.Fact("name", "")])
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        expected = training.prompt(messages, tools=tools)
        proxy = serving.bos_ids + serving.system_ids(system, tools) + serving.open_turn_ids([messages[-1]], enable_thinking=False)
        assert proxy == expected
        assert serving.conversation_ids(messages, tools=tools, enable_thinking=False) == expected  # stateless path


def test_tool_results_match_the_client(formats):
    training, serving = formats
    turn = ep.tool_turn(random.Random(5), tool="get_weather")
    expected = training.tool_results(turn)
    results = [{"tool_call_id": "call_1", "content": turn.result}]
    assert serving.tool_results_ids(results, enable_thinking=False) == expected
