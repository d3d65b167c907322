"""``memt_proxy.chat.plan``: a chat completion request read into a ``Turn`` (tiny Nano checkpoint's real chat format):
thinking, tools and the forced start of a call, the native sampling params, and the prompt — the whole transcript
without memory, only what memory lacks on it."""

from __future__ import annotations

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.client.native import AsyncNativeClient
from memt_proxy.chat.plan import ChatPlanner
from memt_proxy.errors import ProxyError
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.session.sessions import Sessions, SessionState
from memt_proxy.session.transcript import message_hash

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "My name is Ada."},
    {"role": "assistant", "content": "Hello Ada."},
    {"role": "user", "content": "What is my name?"},
]


class Service:  # what the moved tests call the planner's owner
    def __init__(self, plans):
        self.plans = plans
        self.chat_format = plans.chat_format


@pytest.fixture(scope="module")
def service(nano_checkpoint):
    chat_format, _ = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))
    return Service(ChatPlanner(chat_format, Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=chat_format.identity)))


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_options(service):
    assert service.plans.options(request()) == (False, None, "", True)
    assert service.plans.options(request(reasoning_effort="high"))[0] is True
    assert service.plans.options(request(reasoning_effort="minimal"))[0] is False
    assert service.plans.options(request(reasoning_effort="high", chat_template_kwargs={"enable_thinking": False}))[0] is False
    thinking, tools, prefix, parallel = service.plans.options(request(tools=[TOOL], parallel_tool_calls=False))
    assert tools == [TOOL] and prefix == "" and parallel is False
    assert service.plans.options(request(tools=[TOOL], tool_choice="none"))[1] is None  # none: no tools in the template
    assert service.plans.options(request(tools=[TOOL], tool_choice="required"))[2] == service.chat_format.tool_call_prefix()
    named = service.plans.options(request(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}))[2]
    assert named == service.chat_format.tool_call_prefix("get_weather") and "get_weather" in named
    assert not named.endswith(" ")  # a prompt ending in a lone space token is one the model never saw


def test_sampling(service):
    assert service.plans.sampling(request(), []) == {"temperature": 0.0, "max_new_tokens": 1024}
    assert service.plans.sampling(request(max_completion_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop="x"), []) == {
        "temperature": 0.5, "top_p": 0.9, "seed": 3, "max_new_tokens": 7, "stop": ["x"],
    }
    assert service.plans.sampling(request(stop=["a", "b"]), [])["stop"] == ["a", "b"]


def test_on_memory_the_prompt_is_only_what_memory_lacks(service):
    """Memory holding the first exchange: the prompt is the system message and the open turn, not the transcript; an
    empty memory reads the earlier messages as context (committed with the turn); a memory whose history is unknown
    refuses a resent transcript as edited; a stateless turn reads it all."""
    plans, chat_format = service.plans, service.chat_format
    chat = request(messages=CONVERSATION)
    whole = plans.stateless(chat)
    state = SessionState(native="n", tenant="t", name="a")
    state.adopted(1, [message_hash(m) for m in CONVERSATION[1:3]])
    on = plans.on_memory(chat, state)
    assert whole.context == [] and whole.turn_ids == []  # a stateless prompt commits nothing
    assert on.context == [] and on.turn == [CONVERSATION[3]]
    assert len(on.ids) < len(whole.ids) and chat_format.decode(on.ids).count("Ada") == 0
    assert "Ada" in chat_format.decode(whole.ids)
    empty = SessionState(native="e", tenant="t", name="b")
    empty.adopted(0, [])
    again = plans.on_memory(chat, empty)
    assert again.context == CONVERSATION[1:3] and again.turn == [CONVERSATION[3]] and len(again.context_ids) > 0
    unknown = SessionState(native="u", tenant="t", name="c")
    unknown.adopted(1, None)
    with pytest.raises(ProxyError) as refused:
        plans.on_memory(chat, unknown)
    assert refused.value.code == "transcript_diverged"
