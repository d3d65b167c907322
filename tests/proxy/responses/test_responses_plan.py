"""``memt_proxy.responses.plan``: a Responses request read into its turn — the system block (instructions, tools), the
context memory lacks, the open turn (function results continuing a pending turn from its exact tokens), the forced
start of a required call, the sampling params; a header-less input's system items lifted into the instructions and the
messages memory holds left out; what is refused before anything runs (tiny Nano checkpoint's real chat format)."""

from __future__ import annotations

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.client.native import AsyncNativeClient
from memt_proxy.errors import ProxyError
from memt_proxy.prompt import encode
from memt_proxy.responses.plan import ResponsesPlanner
from memt_proxy.responses.protocol import InputItems, ResponseRequest
from memt_proxy.responses.records import Thread
from memt_proxy.session.sessions import PendingTurn, Sessions
from memt_proxy.session.transcript import message_hash

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": TOOL["parameters"]}}
QUESTION = {"role": "user", "content": "Weather in Oslo?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}


class Planned:
    """A planner and its chat format, as the service holds them (its upstream a closed port: limits only)."""

    def __init__(self, chat_format):
        self.chat_format = chat_format
        self.plans = ResponsesPlanner(chat_format, Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=chat_format.identity))


@pytest.fixture(scope="module")
def service(nano_checkpoint):
    return Planned(load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))[0])


def plan(service, input, *, thread=None, uncommitted=(), calls=(), pending=None, held=0, lift=False, **fields):
    request = ResponseRequest.model_validate({"model": "m", "input": input, **fields})
    return service.plans.plan(request, InputItems.of(request.input).items, list(uncommitted), list(calls), pending, held=held, lift=lift)


def test_a_prompt_without_memory_holds_the_system_block_the_context_and_the_open_turn(service):
    chat_format = service.chat_format
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    made = plan(service, history, instructions="Be brief.", tools=[TOOL], max_output_tokens=7, temperature=0.5)
    assert made.context == history[:2] and made.turn == history[2:]
    assert made.ids == chat_format.bos_ids + chat_format.system_ids("Be brief.", [CHAT_TOOL]) + chat_format.history_ids(history[:2]) + chat_format.open_turn_ids(history[2:], enable_thinking=False)
    assert made.context_ids == chat_format.history_ids(history[:2])
    assert made.sampling["max_new_tokens"] == 7 and made.sampling["temperature"] == 0.5


def test_tool_choice_required_or_named_prefills_the_call(service):
    required = plan(service, "Weather?", tools=[TOOL], tool_choice="required")
    named = plan(service, "Weather?", tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})
    assert required.prefix == service.chat_format.tool_call_prefix() and required.ids[-len(encode(service.chat_format, required.prefix)):] == encode(service.chat_format, required.prefix)
    assert named.prefix == service.chat_format.tool_call_prefix("get_weather")
    assert plan(service, "Weather?", tools=[TOOL], tool_choice="none").ids == plan(service, "Weather?").ids  # no tools in the template


def test_function_outputs_continue_the_pending_turn_from_its_exact_tokens(service):
    thread = Thread(id="conv_1", tenant="t", session="s")
    pending = PendingTurn([message_hash(QUESTION), message_hash(CALL)], [7, 8, 9], False)
    made = plan(service, [OUTPUT], thread=thread, uncommitted=[QUESTION, CALL], calls=["c1"], pending=pending)
    results = service.chat_format.tool_results_ids([{"tool_call_id": "c1", "content": "sunny"}], enable_thinking=False)
    assert made.turn_ids == [7, 8, 9] + results and made.context == []
    # the app may resend the call it answers: it is already known, not a second call
    echoed = plan(service, [{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}, OUTPUT], thread=thread, uncommitted=[QUESTION, CALL], calls=["c1"], pending=pending)
    assert echoed.turn_ids == made.turn_ids
    # a pending turn recorded for other messages is not continued: the turn is rebuilt from its messages
    other = PendingTurn(["x", "y"], [7, 8, 9], False)
    rebuilt = plan(service, [OUTPUT], thread=thread, uncommitted=[QUESTION, CALL], calls=["c1"], pending=other)
    assert rebuilt.turn_ids == service.chat_format.open_turn_ids([QUESTION, CALL, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], enable_thinking=False)


def test_what_is_refused_before_anything_runs(service):
    thread = Thread(id="conv_1", tenant="t", session="s")
    with pytest.raises(ProxyError) as missing:
        plan(service, "Never mind.", thread=thread, uncommitted=[QUESTION, CALL], calls=["c1"])
    assert missing.value.code == "tool_results_missing" and "c1" in missing.value.message
    with pytest.raises(ProxyError) as no_user:
        plan(service, [{"role": "assistant", "content": "Hi"}])
    assert no_user.value.code == "invalid_input"


def test_a_headerless_input_lifts_its_system_items_and_leaves_out_what_memory_holds(service):
    chat_format = service.chat_format
    history = [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    lifted = plan(service, history, instructions="Answer in English.", lift=True)
    assert lifted.context == history[1:3] and lifted.turn == history[3:]
    assert lifted.ids == chat_format.bos_ids + chat_format.system_ids("Answer in English.\n\nBe brief.", []) + chat_format.history_ids(history[1:3]) + chat_format.open_turn_ids(history[3:], enable_thinking=False)
    on_memory = plan(service, history, instructions="Answer in English.", lift=True, held=2)  # memory holds the first exchange
    assert on_memory.context == [] and on_memory.turn == history[3:] and on_memory.context_ids == []
    assert on_memory.ids == chat_format.bos_ids + chat_format.system_ids("Answer in English.\n\nBe brief.", []) + chat_format.open_turn_ids(history[3:], enable_thinking=False)
    kept = plan(service, history)  # without lift a system item stays a message of the transcript
    assert kept.context == history[:3]
