"""``memt_proxy.responses.stream``: streamed items reassembled equal to the non-streamed output (tiny Nano's real parser,
fed character by character), and a kept response replayed as the events that announce it, which the ``openai`` SDK's
typed models validate and which rebuild the same output."""

from __future__ import annotations

import asyncio

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_proxy.responses.protocol import Events, ResponseRequest, function_call_item, message_item, reasoning_item, response_object, usage
from memt_proxy.responses.stream import StreamedItems, replayed


@pytest.fixture(scope="module")
def nano(nano_checkpoint):
    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))


@pytest.mark.parametrize("text", [
    "Plain answer.",
    "",
    "Checking.\n{call}",
    "{call}{call}",
])
@pytest.mark.parametrize("one_call", [False, True])
def test_streamed_items_reassemble_to_the_parsed_output(nano, text, one_call):
    parser = nano[1]
    calls = text.count("{call}")
    text = text.replace("{call}", _call_block(parser))
    parsed = parser.parse(text)
    assert len(parsed.tool_calls) == calls
    expected = [("message", parsed.content)] if parsed.content or not parsed.tool_calls else []
    expected += [("function_call", c.name, c.arguments) for c in parsed.tool_calls[: 1 if one_call else None]]
    events, stream = Events(), parser.stream()
    items = StreamedItems(events, one_call=one_call)
    emitted = []
    for end in range(1, len(text) + 1):  # character by character, as a worst-case token stream
        emitted += items.feed(stream.feed(text[:end]))
    emitted += items.feed(stream.finish(text)) + items.close()
    for event in emitted:
        TypeAdapter(ResponseStreamEvent).validate_python(event)
    assert [e["sequence_number"] for e in emitted] == list(range(len(emitted)))
    got = [("message", i["content"][0]["text"]) if i["type"] == "message" else ("function_call", i["name"], i["arguments"]) for i in items.output]
    assert got == expected, emitted
    texts = "".join(e["delta"] for e in emitted if e["type"] == "response.output_text.delta")
    assert texts == (parsed.content if expected and expected[0][0] == "message" else "")


def _call_block(parser) -> str:
    return f'{parser.call_open}{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}{parser.call_close}'


def test_a_kept_response_is_replayed_as_the_events_that_announced_it():
    """A client's retry of a streamed request whose answer is kept gets it as a stream: the events, in order, rebuild the
    kept output, and the last carries the response itself."""
    request = ResponseRequest.model_validate({"model": "m", "input": "hi"})
    output = [reasoning_item("Think."), message_item("Hello there."), function_call_item({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}})]
    body = response_object(request, response_id="resp_1", created_at=1, status="completed", output=output, usage=usage(3, 4))

    async def collect():
        return [event async for event in replayed(body)]

    events = asyncio.run(collect())
    for event in events:
        TypeAdapter(ResponseStreamEvent).validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"] and events[0]["response"]["status"] == "in_progress"
    assert events[-1] == {"type": "response.completed", "response": body, "sequence_number": len(events) - 1}
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == output
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello there."
    cut = {**body, "status": "incomplete"}
    assert asyncio.run(_last(cut))["type"] == "response.incomplete"


async def _last(body: dict) -> dict:
    return [event async for event in replayed(body)][-1]
