"""ResponsesService: a thread's memory confirmed or its turn resent, an answer committed without the markup the app
never saw, a large input planned off the event loop (tiny Nano checkpoint's real chat format and parser); on the session
harness, an answer parsed once. What the prompt holds: ``test_responses_plan.py``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.client.native import AsyncNativeClient
from memt_proxy.responses.records import ResponseRecords, Thread
from memt_proxy.errors import ProxyError
from memt_proxy.responses.service import ResponsesService
from memt_proxy.responses.protocol import InputItems, ResponseRequest
from memt_proxy.session.sessions import Sessions, SessionState
from memt_proxy.request_context import RequestContext
from memt_proxy.session.turn import NO_MEMORY, Turn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session"))  # the session harness
from session_harness import asked, run, surfaces  # noqa: E402

QUESTION = {"role": "user", "content": "Weather in Oslo?"}


@pytest.fixture(scope="module")
def service(nano_checkpoint):
    chat_format, parser = load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))
    sessions = Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=chat_format.identity)
    return ResponsesService(sessions, chat_format, parser, ResponseRecords(None), model_names=["m"])


def plan(service, input, *, thread=None, uncommitted=(), calls=(), pending=None, **fields):
    request = ResponseRequest.model_validate({"model": "m", "input": input, **fields})
    return service.plans.plan(request, InputItems.of(request.input).items, list(uncommitted), list(calls), pending)


@pytest.mark.parametrize(("upstream", "expected"), [(3, "landed"), (2, "lost"), (1, "refused"), (4, "refused")])
def test_the_turn_committed_behind_the_last_answer_is_confirmed_or_resent(service, upstream, expected):
    said = [{"role": "user", "content": "I live in Lisbon."}, {"role": "assistant", "content": "Noted."}]
    thread = Thread(id="conv_1", tenant="t", session="s", version=3, behind=list(said), uncommitted=[{"role": "user", "content": "added"}])
    held = service.sessions.held(SessionState(native="n", version=upstream))
    if expected == "refused":  # memory moved in a way the proxy did not make: never answer from it
        with pytest.raises(ProxyError) as refused:
            asyncio.run(service.threads.confirm(held, thread))
        assert refused.value.status == 409 and refused.value.code == "memory_version_mismatch"
        return
    asyncio.run(service.threads.confirm(held, thread))
    assert thread.behind == []
    if expected == "landed":
        assert thread.version == 3 and thread.uncommitted == [{"role": "user", "content": "added"}]
    else:  # the write did not land: its messages go with the next input, as context, and are committed with it
        assert thread.version == 2 and thread.uncommitted == said + [{"role": "user", "content": "added"}]


def test_a_conversation_whose_memory_the_upstream_lost_is_rebuilt_from_its_items(service):
    """Issue 58 item 3: after an upstream restart without a snapshot store the conversation's session is new and empty
    (version 0) though the proxy recorded two writes: every item goes with the next input as context (was: 409
    memory_version_mismatch forever). A chain keeps no items: it is still refused."""
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "I live in Lisbon."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    ]
    thread = Thread(id="conv_1", tenant="t", session="s", version=2, items=items, uncommitted=[QUESTION], calls=["c1"], snapshot_of="resp_1")
    asyncio.run(service.threads.confirm(service.sessions.held(SessionState(native="n", exists=True)), thread))
    assert thread.version == 0 and thread.behind == [] and thread.snapshot_of is None
    assert thread.uncommitted == [
        {"role": "user", "content": "I live in Lisbon."}, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
    ]
    chain = Thread(id="chain_1", tenant="t", session="s", version=2)
    with pytest.raises(ProxyError) as refused:
        asyncio.run(service.threads.confirm(service.sessions.held(SessionState(native="n", exists=True)), chain))
    assert refused.value.code == "memory_version_mismatch"


def received(service, made, ids: list[int]) -> list[int]:
    """What memory keeps of the answer ``ids``, as the service settles it."""
    return service.runner.reply_ids(Turn(made, NO_MEMORY, RequestContext("t", "auto", 0, "")), ids, service._received(made, ids))


def test_an_answer_is_committed_without_the_markup_the_app_never_saw(service):
    chat_format = service.chat_format
    eos = chat_format.tokenizer.eos_token_id
    made = plan(service, "Hi")
    messy = chat_format._encode("Hi <tool_call>not a call</tool_call> there.</think>") + [eos]
    committed = received(service, made, messy)
    assert chat_format.decode(committed) == "Hi not a call there." and committed[-1] == eos
    clean = chat_format._encode("Hi there.") + [eos]
    assert received(service, made, clean) == clean  # a clean answer is committed as generated


def test_a_large_input_is_planned_off_the_event_loop(service):
    """A 3.8 MB input once blocked /health and every route for seconds (issue 38): its plan is made in the worker."""
    import asyncio
    import threading

    request = ResponseRequest.model_validate({"model": "m", "input": "word " * 20_000})  # 100 KB
    context = RequestContext("t", "auto", len(request.model_dump_json()), "")
    seen = []
    plan_of = service.plans.plan

    def recording(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return plan_of(*args, **kwargs)

    service.plans.plan = recording
    try:
        made = asyncio.run(service._planned(request, context, InputItems.of(request.input).items, None, [], [], None))
    finally:
        del service.plans.plan
    assert seen and seen[0].startswith("memt-prepare"), seen
    assert made.turn.prompt.turn == [{"role": "user", "content": "word " * 20_000}]
    assert made.turn.context is context and made.turn.memory.state is None


class CountedParser:
    """The real output parser, counting its whole-answer parses."""

    def __init__(self, parser):
        self.parser, self.parsed = parser, 0

    def parse(self, *args, **kwargs):
        self.parsed += 1
        return self.parser.parse(*args, **kwargs)

    def stream(self, *args, **kwargs):
        return self.parser.stream(*args, **kwargs)


def test_an_answer_is_parsed_once_and_memory_keeps_the_text_the_app_received():
    """On the session harness: a non-streamed answer is parsed once (it was parsed again to find what memory keeps), as
    a streamed one is once at its end; either way the turn's ``kept`` is the text the app received."""
    async def body(h):
        _, responses = surfaces(h)
        counted = responses.parser = CountedParser(responses.parser)
        kept, after = [], responses.runner.after

        def recording(turn, *args, **kwargs):
            kept.append(kwargs["kept"])
            return after(turn, *args, **kwargs)

        responses.runner.after = recording
        answer = await responses.create(*asked(ResponseRequest.model_validate({"model": "m", "input": "Hello", "max_output_tokens": 6})))
        once = counted.parsed
        events = [event async for event in await responses.create(
            *asked(ResponseRequest.model_validate({"model": "m", "input": "Hello", "max_output_tokens": 6, "stream": True})))]
        return once, counted.parsed - once, kept, answer, events[-1]["response"]

    once, streamed, kept, answer, last = run(body)
    assert once == 1 and streamed == 1
    texts = [answer["output"][0]["content"][0]["text"], last["output"][0]["content"][0]["text"]]
    assert [text.strip() for text in kept] == texts and texts[0]  # the parser's text keeps the answer's leading space
