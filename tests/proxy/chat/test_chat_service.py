"""ChatService's decisions that need no upstream: stop strings, what a completed turn commits, tool-call messages
(tiny Nano checkpoint's real chat format/parser); the planner's are tests/proxy/chat/test_chat_plan.py, the
stream's test_chat_stream.py."""

from __future__ import annotations

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.client.native import AsyncNativeClient
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.chat.service import ChatService
from memt_proxy.request_context import RequestContext
from memt_proxy.session.turn import NO_MEMORY, Prompt, Turn
from memt_proxy.session.sessions import Sessions

@pytest.fixture(scope="module")
def service(nano_checkpoint):
    chat_format, parser = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))
    return ChatService(Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=chat_format.identity), chat_format, parser, model_names=["m"])


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def prepared(service, *, stops=(), prefix="", parallel=True, thinking=False) -> Prompt:
    return Prompt([], thinking=thinking, prefix=prefix, stops=list(stops), parallel_tools=parallel)


def reply_ids(service, prompt: Prompt, ids: list[int]) -> list[int]:
    """What memory keeps of an answer, as the service does it: the text the app received, then its ids."""
    kept = service._message(prompt, service._text(prompt, ids, final=True)[0], "stop")[2]
    return service.runner.reply_ids(Turn(prompt, NO_MEMORY, RequestContext("t", "auto", 0, "")), ids, kept)


def test_earliest_stop_string_wins(service):
    ids = service.chat_format._encode("hello world, everyone")
    text, stopped = service._text(prepared(service, stops=[" ", "e"]), ids, final=True)
    assert (text, stopped) == ("h", True)  # "e" comes first in the text, though second in the list
    text, stopped = service._text(prepared(service, stops=["zzz"]), ids, final=True)
    assert (text, stopped) == ("hello world, everyone", False)
    # while streaming, a tail that could still become a stop string is held back
    assert service._text(prepared(service, stops=["one!"]), ids, final=False) == ("hello world, every", False)
    # a forced prefix is part of the text
    assert service._text(prepared(service, prefix="<x>"), ids, final=True)[0] == "<x>hello world, everyone"


def test_committed_reply_ids(service):
    chat_format = service.chat_format
    eos = chat_format.tokenizer.eos_token_id
    assert eos in chat_format.end_ids
    ids = chat_format._encode("alpha beta gamma")
    # ended by the model's end token, or no stop strings at all: the generated ids as they are
    assert reply_ids(service, prepared(service, stops=["zzz"]), ids + [eos]) == ids + [eos]
    assert reply_ids(service, prepared(service), ids) == ids
    # cut by a stop string: what the client received, then the end token (never the stop string)
    assert reply_ids(service, prepared(service, stops=["beta"]), ids) == chat_format._encode("alpha ") + [eos]
    assert reply_ids(service, prepared(service, stops=["nowhere"]), ids) == ids
    # with a forced prefix (already in the turn's ids) only the generated part follows
    cut = reply_ids(service, prepared(service, stops=["gamma"], prefix="pre: "), ids)
    assert cut == chat_format._encode("alpha beta ") + [eos]


@pytest.mark.parametrize("generated, received", [
    ("Hi <tool_call>not a call</tool_call> there.", "Hi not a call there."),  # a malformed call: its text, no markup
    ("The answer.<think>\n\n</think>\n\nMore.", "The answer.\n\nMore."),  # a reasoning block inside the answer
    ("Sunny</think> today.", "Sunny today."),  # a stray closing tag
    ("Let me check. <tool_call>{\"name\": \"get_wea", "Let me check. {\"name\": \"get_wea"),  # unterminated
])
def test_markup_the_app_never_sees_is_never_committed(service, generated, received):
    chat_format = service.chat_format
    eos = chat_format.tokenizer.eos_token_id
    ids = chat_format._encode(generated) + [eos]
    ready = prepared(service)
    message, finish, _ = service._message(ready, service._text(ready, ids, final=True)[0], "stop")
    assert (message["content"], finish) == (received.strip(), "stop")
    committed = reply_ids(service, ready, ids)
    assert committed[-1] == eos and chat_format.decode(committed) == received
    for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
        assert tag not in chat_format.decode(committed)
    clean = chat_format._encode("A clean answer.") + [eos]  # a clean answer is committed as generated
    ready = prepared(service)
    service._message(ready, service._text(ready, clean, final=True)[0], "stop")
    assert reply_ids(service, ready, clean) == clean


def test_tool_call_messages(service):
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    message, finish, _ = service._message(prepared(service), text, "stop")
    assert finish == "tool_calls" and message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [("get_weather", '{"city": "Oslo"}')]
    two = text + "\n" + text.replace("Oslo", "Rome")
    assert len(service._message(prepared(service), two, "stop")[0]["tool_calls"]) == 2
    assert len(service._message(prepared(service, parallel=False), two, "stop")[0]["tool_calls"]) == 1
    message, finish, _ = service._message(prepared(service), text, "length")  # a truncated reply is not a tool call
    assert finish == "length" and "tool_calls" not in message
    message, finish, _ = service._message(prepared(service, thinking=True), "plan</think>Answer", "stop")
    assert message == {"role": "assistant", "content": "Answer", "reasoning_content": "plan"} and finish == "stop"


def test_a_failed_session_record_write_is_logged_and_the_change_goes_on(nano_checkpoint, tmp_path, caplog):
    """The record is an aid for restarts: losing one must not fail the request (the history then counts as unknown)."""
    import logging

    from memt_proxy.session.store import SessionRecordStore

    chat_format, parser = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))
    service = ChatService(Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=chat_format.identity,
                                   records=SessionRecordStore(tmp_path / "state")), chat_format, parser, model_names=["m"])
    state = service.sessions.state("tenant", "s")
    (tmp_path / "state").rmdir()  # e.g. the directory was removed under the running proxy
    with caplog.at_level(logging.WARNING, logger="memt.proxy"):
        service.sessions.writes.changing(state, ["a" * 64])
    assert any("could not write the session record" in r.message for r in caplog.records)


def test_a_pending_tool_turn_is_kept_until_a_request_ends_it(nano_checkpoint, tmp_path):
    """Continuing a pending turn keeps it (a retry continues it too); a refused request changes nothing;
    a new question abandons it, in memory and in the session's record."""
    import asyncio

    from memt_proxy.errors import ProxyError
    from memt_proxy.session.sessions import PendingTurn
    from memt_proxy.session.store import SessionRecordStore
    from memt_proxy.session.transcript import message_hash

    chat_format, parser = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))
    store = SessionRecordStore(tmp_path / "state")
    service = ChatService(Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=chat_format.identity, records=store),
                          chat_format, parser, model_names=["m"])
    state = service.sessions.state("tenant", "s")
    question = {"role": "user", "content": "weather in Oslo?"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
    pending = PendingTurn([message_hash(question), message_hash(call)], chat_format._encode("the call's own tokens"), False)
    service.sessions.writes.set_pending(state, pending)
    assert store.load_pending(state.native, 0) == {"hashes": pending.hashes, "ids": pending.ids, "thinking": False}

    def prepare(messages, **fields):
        asked = request(messages=messages, **fields)

        async def plan(memory, hashes=None):
            return service.plans.on_memory(asked, memory.state, hashes)

        return asyncio.run(service.runner._on_named(state, "auto", True, plan, lambda state: False))  # strict: no starting over

    results = [question, call, {"role": "tool", "tool_call_id": "call_1", "content": "3 degrees"}]
    continued = prepare(results)
    assert continued.turn_ids[: len(pending.ids)] == pending.ids  # the call's exact tokens, then the results
    assert state.pending is pending and store.load_pending(state.native, 0) is not None  # kept until the turn ends
    assert prepare(results).turn_ids == continued.turn_ids  # so a retry continues it the same way

    service.sessions.upstream.max_prefill_tokens = len(continued.ids) - 1
    refusals = {"context_length_exceeded": results, "tool_results_missing": [question, call, {"role": "user", "content": "never mind"}]}
    for code, messages in refusals.items():
        with pytest.raises(ProxyError) as refused:
            prepare(messages)
        assert refused.value.code == code
        assert state.pending is pending and store.load_pending(state.native, 0) is not None  # refused: nothing changed
    service.sessions.upstream.max_prefill_tokens = None

    prepare([{"role": "user", "content": "something else"}])  # a new question abandons it
    assert state.pending is None and store.load_pending(state.native, 0) is None
