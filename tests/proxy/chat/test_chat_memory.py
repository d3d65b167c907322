"""``memt_proxy.chat.memory`` on the session harness: where a chat turn is answered (``OnMemory``) — a named session
held with the maker of its turn on that memory, a client's retry of its last turn as the kept answer (the session let
go), a header-less request with no kept state as a plain generation's turn (nothing held), and a header-less retry as
its kept answer. ChatMemory answers nothing itself: the service does (tiny Nano checkpoint's real chat format)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session"))  # the session harness

from memt_core.client.chat_format import load_chat_format, load_tokenizer  # noqa: E402
from memt_proxy.chat.memory import ChatMemory  # noqa: E402
from memt_proxy.chat.plan import ChatPlanner  # noqa: E402
from memt_proxy.protocol import ChatCompletionRequest  # noqa: E402
from memt_proxy.request_context import RequestContext  # noqa: E402
from memt_proxy.session.retries import IN_SESSION_RECORD  # noqa: E402
from memt_proxy.session.turn import TurnRunner  # noqa: E402
from session_harness import run  # noqa: E402

ASK = {"model": "m", "messages": [{"role": "user", "content": "Hello there."}]}


@pytest.fixture(scope="module")
def chat_format(nano_checkpoint):
    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))[0]


def memory_of(sessions, chat_format) -> ChatMemory:
    return ChatMemory(sessions, TurnRunner(sessions, chat_format), ChatPlanner(chat_format, sessions))


def test_a_named_turn_is_held_with_the_maker_of_its_turn_and_a_retry_gets_the_kept_answer(chat_format):
    async def body(h):
        memory = memory_of(h.sessions, chat_format)
        request = ChatCompletionRequest.model_validate(ASK)
        context = RequestContext("t", "auto", 10, "d1")
        on = await memory.named(request, context, session="a", strict=False)
        turn = await on.prepare()
        held = (on.held.state.name, on.held.state.lock.locked(), on.replay, on.turn)
        on.held.state.last_turn = {"digest": "d1", "key": None, "version": on.held.state.version, "message": {"role": "assistant", "content": "Hi."}}
        await on.hold.aclose()
        retried = await memory.named(request, RequestContext("t", "auto", 10, "d1", retry=True), session="a", strict=False)
        again = await memory.named(request, context, session="a", strict=False)  # the same request, no retry: a regenerate, held again
        await again.hold.aclose()
        return held, turn, retried, h.sessions.state("t", "a").lock.locked(), again.held is not None

    held, turn, retried, locked, regenerate = run(body)
    assert held == ("a", True, None, None)
    assert turn.memory.keep_parent and turn.context.digest == "d1" and turn.prompt.turn == [ASK["messages"][0]] and turn.memory.state is not None
    assert turn.memory.retries is IN_SESSION_RECORD  # a named session's answer is kept in its record
    assert retried.replay["message"]["content"] == "Hi." and retried.held is None and not locked  # let go at once
    assert regenerate


def test_a_headerless_request_without_a_kept_state_is_a_plain_generation_and_its_retry_the_kept_answer(chat_format):
    async def body(h):
        memory = memory_of(h.sessions, chat_format)
        request = ChatCompletionRequest.model_validate(ASK)
        context = RequestContext("t", "auto", 10, "d2", key="k")
        on = await memory.headerless(request, context)
        memory.runner.answers.keep("t", "d2", "k", {"kept": True})
        by_key = await memory.headerless(request, context)  # the same Idempotency-Key: a retry
        other = await memory.headerless(request, RequestContext("t", "auto", 10, "d2", key="other"))  # another key, no retry: answered anew
        return on, by_key, other, len(h.sessions.table), memory.runner.answers

    on, by_key, other, states, answers = run(body)
    assert on.held is None and on.hold is None and on.replay is None
    turn = on.turn
    assert turn.memory.headerless is not None and turn.memory.state is None and turn.context.digest == "d2" and turn.memory.opening is not None
    assert turn.memory.policy == "auto" and turn.memory.retries is answers  # kept for a retry by the runner
    assert by_key.replay == {"kept": True} and other.replay is None and other.turn is not None
    assert states == 0  # nothing was held or made
