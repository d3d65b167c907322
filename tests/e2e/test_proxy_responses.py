"""The Responses and Conversations APIs of the proxy, live, with the official ``openai`` SDK.

On the bundled demo model (``demo_proxy``): a conversation of 21 turns whose prompt holds only each new
input (``usage.input_tokens`` equals the tokens of that input alone) and that recalls turn 1's fact
in turn 21; a ``previous_response_id`` chain of 5 and a branch from response 2 that reads response
2's memory exactly (greedy: it answers as a twin chain continued at response 2 does) and not what
3–5 added; function-tool round trips, streamed and not, whose streamed events reassemble to the
non-streamed response; stored responses (retrieve, input_items, delete) and ``store: false``.
"""

from __future__ import annotations

import json

import openai
import pytest
from e2e.proxies import DEMO_MODEL, demo_chat_format

from memt_demo.tool_turns import TOOLS

pytestmark = pytest.mark.timeout(600)

WEATHER = [{"type": "function", **TOOLS["get_weather"]["function"]}, {"type": "function", **TOOLS["add"]["function"]}]
RESULT = json.dumps({"city": "Paris", "temperature": 21, "condition": "sunny"})
FILLER = ["What is 2 plus 3?", "Tell me something nice.", "What is the weather like today?", "Repeat after me: blue sky.", "Thanks!"]  # answered within the cap


@pytest.fixture(scope="module")
def client(demo_proxy):
    return demo_proxy.openai("unused")


def create(client, **kwargs):
    kwargs.setdefault("temperature", 0.0)
    kwargs.setdefault("max_output_tokens", 48)
    return client.responses.create(model=DEMO_MODEL, **kwargs)


def prompt_tokens(text: str, *, tools: list | None = None) -> int:
    """Tokens of a prompt holding only the system block and ``text`` as the open turn (nothing from memory)."""
    chat_format = demo_chat_format()
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools] if tools else None
    return len(chat_format.bos_ids + chat_format.system_ids(None, chat_tools) + chat_format.open_turn_ids([{"role": "user", "content": text}], enable_thinking=False))


def test_a_conversation_keeps_the_prompt_flat_for_21_turns_and_recalls_turn_1(client):
    conversation = client.conversations.create(metadata={"app": "test"})
    inputs = ["I live in Lisbon."] + [FILLER[i % len(FILLER)] for i in range(19)] + ["Where do I live?"]
    for text in inputs:
        response = create(client, conversation=conversation.id, input=text)
        assert response.status == "completed" and response.conversation.id == conversation.id
        # the model read only this input: every earlier turn is in memory, none in the prompt
        assert response.usage.input_tokens == prompt_tokens(text), text
    assert "Lisbon" in response.output_text, response.output_text
    items = client.conversations.items.list(conversation.id, limit=100)
    assert [i.type for i in items.data] == ["message"] * 42
    assert items.data[0].content[0].text == "I live in Lisbon." and items.data[-1].role == "assistant"
    assert client.conversations.retrieve(conversation.id).metadata == {"app": "test"}


def test_a_chain_of_5_and_a_branch_from_response_2(client):
    said = ["My name is Tomasz.", "I live in Lisbon.", "I have a parrot named Kiwi.", "I live in Oslo.", "My name is Ravi."]
    chain = []
    for text in said:
        chain.append(create(client, input=text, previous_response_id=chain[-1].id if chain else None))
    assert [r.previous_response_id for r in chain[1:]] == [r.id for r in chain[:-1]]
    question = "Where do I live?"
    # a twin chain continued at its response 2: the answer from exactly response 2's memory
    twin = create(client, input=said[0])
    twin = create(client, input=said[1], previous_response_id=twin.id)
    expected = create(client, input=question, previous_response_id=twin.id)
    branch = create(client, input=question, previous_response_id=chain[1].id)
    assert branch.output_text == expected.output_text
    assert branch.usage.input_tokens == expected.usage.input_tokens == prompt_tokens(question)
    assert "Oslo" not in branch.output_text  # response 4 said Oslo; the branch never saw it
    latest = create(client, input=question, previous_response_id=chain[-1].id)
    assert latest.usage.input_tokens == prompt_tokens(question)
    # the branch is a chain of its own, and the original chain's latest still continues in place
    again = create(client, input=question, previous_response_id=branch.id)
    assert again.output_text == branch.output_text


def test_the_first_continuation_of_a_response_without_memory_carries_its_messages(client):
    first = create(client, input="I live in Lisbon.")
    assert first.usage.input_tokens == prompt_tokens("I live in Lisbon.")
    second = create(client, input="Where do I live?", previous_response_id=first.id)
    assert second.usage.input_tokens > prompt_tokens("Where do I live?")  # first's turn as context, now committed
    third = create(client, input="Where do I live?", previous_response_id=second.id)
    assert third.usage.input_tokens == prompt_tokens("Where do I live?")


def output_of(response) -> list[tuple]:
    """The meaning of a response's output (ids and call ids are fresh per response)."""
    out = []
    for item in response.output:
        if item.type == "message":
            out.append(("message", "".join(p.text for p in item.content)))
        elif item.type == "function_call":
            out.append(("function_call", item.name, json.loads(item.arguments)))
    return out


def reassemble(events) -> tuple[list[tuple], object]:
    """The output rebuilt from stream events alone, as a client does, and the final response."""
    items, texts, arguments, final = {}, {}, {}, None
    for number, event in enumerate(events):
        assert event.sequence_number == number
        if event.type == "response.output_item.added":
            items[event.output_index] = event.item
        elif event.type == "response.output_text.delta":
            texts[event.item_id] = texts.get(event.item_id, "") + event.delta
        elif event.type == "response.function_call_arguments.delta":
            arguments[event.item_id] = arguments.get(event.item_id, "") + event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    rebuilt = []
    for index in sorted(items):
        item = items[index]
        if item.type == "message":
            rebuilt.append(("message", texts.get(item.id, "")))
        elif item.type == "function_call":
            rebuilt.append(("function_call", item.name, json.loads(arguments[item.id])))
    assert final is not None, "no response.completed event"
    return rebuilt, final


def tool_round(client, *, stream: bool):
    """call → function_call_output → final answer, in a conversation; returns (call response, answer response) outputs."""
    conversation = client.conversations.create()
    responses = []
    for input in ("What is the weather in Paris?", None):
        if input is None:
            call = next(i for i in responses[-1][1].output if i.type == "function_call")
            input = [{"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
        if stream:
            events = list(create(client, conversation=conversation.id, input=input, tools=WEATHER, stream=True))
            rebuilt, final = reassemble(events)
            assert rebuilt == output_of(final)
            responses.append((rebuilt, final))
        else:
            response = create(client, conversation=conversation.id, input=input, tools=WEATHER)
            responses.append((output_of(response), response))
    # the turn was committed after the final answer: the next prompt holds only the next input
    after = create(client, conversation=conversation.id, input="Thanks!")
    assert after.usage.input_tokens == prompt_tokens("Thanks!")
    return responses


def test_a_function_tool_round_trip_streamed_reassembles_to_the_non_streamed_one(client):
    plain = tool_round(client, stream=False)
    streamed = tool_round(client, stream=True)
    (call_output, call), (answer_output, answer) = plain
    assert len(call_output) == 1 and call_output[0][:2] == ("function_call", "get_weather"), call_output
    assert call.status == "completed"
    assert answer_output[0][0] == "message" and answer_output[0][1], answer_output
    assert [s[0] for s in streamed] == [p[0] for p in plain]  # the same outputs, event by event
    # the continued turn read the call's exact tokens plus the result, not the question again as a new turn
    assert answer.usage.input_tokens > call.usage.input_tokens


def test_function_calls_must_be_answered_before_a_new_message(client, demo_proxy):
    conversation = client.conversations.create()
    call = create(client, conversation=conversation.id, input="What is the weather in Paris?", tools=WEATHER)
    assert call.output[0].type == "function_call"
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, conversation=conversation.id, input="Never mind.", tools=WEATHER)
    assert refused.value.body["code"] == "tool_results_missing" and call.output[0].call_id in refused.value.body["message"]


def test_stored_responses_can_be_read_listed_and_deleted_and_unstored_ones_cannot(client):
    stored = create(client, input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello!"}]}], metadata={"k": "v"})
    assert client.responses.retrieve(stored.id).output_text == stored.output_text
    items = client.responses.input_items.list(stored.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Hello!")]
    client.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stored.id)
    unstored = create(client, input="Hello!", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, input="Hi", previous_response_id=unstored.id)
    assert refused.value.body["code"] == "previous_response_not_found"


def test_deleting_a_conversation_forgets_it(client):
    conversation = client.conversations.create()
    create(client, conversation=conversation.id, input="I live in Lisbon.")
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        create(client, conversation=conversation.id, input="Where do I live?")
    unused = client.conversations.create(items=[{"type": "message", "role": "user", "content": "I live in Lisbon."}])
    assert client.conversations.delete(unused.id).deleted  # no response made its session upstream: nothing to close


def test_items_given_to_a_conversation_are_sent_once_then_in_memory(client):
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "My name is Tomasz."}])
    client.conversations.items.create(conversation.id, items=[{"type": "message", "role": "user", "content": "I live in Lisbon."}])
    first = create(client, conversation=conversation.id, input="Where do I live?")
    chat_format = demo_chat_format()
    given = chat_format.history_ids([{"role": "user", "content": "My name is Tomasz."}, {"role": "user", "content": "I live in Lisbon."}])
    assert first.usage.input_tokens == prompt_tokens("Where do I live?") + len(given)  # the given items, as context this once
    second = create(client, conversation=conversation.id, input="Where do I live?")
    assert second.usage.input_tokens == prompt_tokens("Where do I live?")
    texts = [item.content[0].text for item in client.conversations.items.list(conversation.id).data]
    assert texts[:3] == ["My name is Tomasz.", "I live in Lisbon.", "Where do I live?"] and len(texts) == 6
