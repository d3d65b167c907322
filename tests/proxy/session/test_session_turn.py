"""``memt_proxy.session.turn`` (the turn runner both surfaces use) on the in-process harness.

``after``: function calls leave the turn pending (its exact tokens, recorded); policy ``read`` or a cut answer ends it
as context; ``auto`` commits behind the answer, a named session keeping the state before it (``keep_parent``); a
session following a kept state it forked from commits from a copy of it (``source``); a header-less turn forks the
conversation's next state instead. Answers are kept for a client's retry only when the turn has a ``digest``.
``answer``/``handed``/``streaming``: a held session is let go when its answer ends, when its stream ends (or is
left), and when its stream is never started (after ``STREAM_START_TIMEOUT``). ``run``, the one entry: a kept answer
replayed, a plain turn answered holding nothing. A turn's parts are frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from memt_proxy.errors import Unavailable
from memt_proxy.request_context import RequestContext
from memt_proxy.session import turn as turn_module
from memt_proxy.session.headerless import plan_headerless
from memt_proxy.session.prefix_index import Found, chain
from memt_proxy.session.state import PendingTurn
from memt_proxy.session.retries import IN_SESSION_RECORD
from memt_proxy.session.transcript import message_hash
from memt_proxy.session.turn import MemoryPlan, OnMemory, Prompt, Turn, TurnRunner
from session_harness import kept, kept_state, committed_session, run, settle, until

EOS = 99
H1, HX = "1" * 64, "9" * 64


class Format:
    """The chat format's part the runner uses: the end token a cut answer is closed with (replies kept as generated)."""

    class tokenizer:
        eos_token_id = EOS

    def decode(self, ids):
        return " ".join(map(str, ids))


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]}


async def keep(sessions, tenant: str, messages: list[dict], ids: list[int]):
    return await kept_state(sessions, tenant, [message_hash(m) for m in messages], ids)


def planned(policy: str = "auto", *, digest: str = "", key: str | None = None, prompt: Prompt | None = None, **memory) -> Turn:
    """A turn of tenant "t" as a surface builds it: its prompt, the memory plan (``memory``: ``MemoryPlan``'s fields)
    and the request's context."""
    return Turn(prompt or Prompt([1]), MemoryPlan(policy, **memory), RequestContext("t", policy, 0, digest, key=key))


class Answering:
    """A surface's side of ``TurnRunner.run`` (an ``Answerer``): ``answered(turn, held)`` (else a native generation), the
    native stream's bodies as its events, a kept answer replayed as it is."""

    def __init__(self, runner, answered=None):
        self.runner, self.answered = runner, answered

    def answer(self, turn, held):
        return (self.answered or self.runner.generate)(turn, held)

    def events(self, turn, held):
        return self.runner.generate_stream(turn, held)

    def replayed(self, kept):
        return {"replayed": kept}


# ---- after the answer


def test_tool_calls_leave_the_turn_pending_with_its_exact_tokens(tmp_path):
    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        async with sessions.turn("t", "a") as held:
            await held.start()
            turn = planned(prompt=Prompt([3], [3], turn=[user("look it up")]), keep_parent=True, retries=IN_SESSION_RECORD, digest="d")
            version = runner.after(turn, held, [CALL], [7, 8], "tool_calls", answered={"message": "call"})
            later = held.later
        await settle(sessions)
        return version, later, state, sessions.records.load_pending(state.native, 1), h.memory(state.native), kept(sessions), runner

    version, later, state, recorded, memory, states, runner = run(body, state=tmp_path)
    hashes = [message_hash(user("look it up")), message_hash(CALL)]
    assert version is None and later is None and states == []  # nothing written, nothing kept
    assert state.last_turn is None and not runner.answers._kept  # a named session keeps an answer for a retry only with a commit
    assert state.pending == PendingTurn(hashes, [3, 7, 8], False)
    assert recorded == {"hashes": hashes, "ids": [3, 7, 8], "thinking": False}  # a restarted proxy continues it
    assert state.version == 1 and memory == (1, 2)


@pytest.mark.parametrize(("policy", "finish"), [("read", "stop"), ("auto", "length")])
def test_a_read_turn_or_a_cut_answer_ends_the_turn_as_context(tmp_path, policy, finish):
    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        async with sessions.turn("t", "a") as held:
            await held.start()
            sessions.writes.set_pending(held.state, PendingTurn([HX], [5], False))  # an earlier tool round
            turn = planned(policy, prompt=Prompt([3], [3], turn=[user("go on")]), keep_parent=True)
            version = runner.after(turn, held, [assistant("done")], [4], finish)
            later = held.later
        await settle(sessions)
        return version, later, state, sessions.records.load_pending(state.native, 1), h.memory(state.native), sessions.writes.published

    version, later, state, recorded, memory, writes = run(body, state=tmp_path)
    assert version is None and later is None
    assert state.pending is None and recorded is None  # the tool round ended; in the record too
    assert state.version == 1 and state.committed == [H1] and memory == (1, 2) and writes == 1


def test_auto_commits_behind_the_answer_keeping_the_state_before_it(tmp_path):
    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        async with sessions.turn("t", "a") as held:
            await held.start()
            prompt = Prompt([3, 4], turn_ids=[4], context_ids=[3], context=[assistant("before")], turn=[user("now")])
            turn = planned(prompt=prompt, keep_parent=True, retries=IN_SESSION_RECORD, digest="d")
            version = runner.after(turn, held, [assistant("answer")], [5, 6], "stop", answered={"message": "answer"})
            later = held.later
            written_yet = state.version
        await settle(sessions)
        parents = kept(sessions)
        return (version, later, written_yet, state, h.memory(state.native), parents, [h.memory(p.native) for p in parents],
                sessions.records.load_answer(state.native, 2), sessions.memory_tokens.held(state), sessions.kept.prefixes.find(chain("t", [H1])), runner)

    version, later, written_yet, state, memory, parents, parent_memory, recorded, tokens, found, runner = run(body, state=tmp_path)
    assert version == 2 and written_yet == 1  # behind the answer: not before the request let go
    assert later.keep_parent and later.source is None and later.commits == [[3], [4, 5, 6]]
    assert state.version == 2 and memory == (1, 2, 3, 4, 5, 6)
    assert state.committed == [H1, message_hash(assistant("before")), message_hash(user("now")), message_hash(assistant("answer"))]
    assert len(parents) == 1 and parents[0].origin == state.native and parents[0].committed == [H1] and parent_memory == [(1, 2)]
    assert found == Found(1, parents[0].name)
    assert state.last_turn == {"digest": "d", "key": None, "version": 2, "message": "answer"} == recorded
    assert tokens == 4  # context, turn and reply, counted for the session's next prompts
    assert not runner.answers._kept  # a named session's answer is kept once: in its record, not also in the runner


def test_a_session_following_a_kept_state_commits_from_a_copy_of_it():
    """A named session's request forked from a kept state (``MemoryPlan.follower``): the session becomes a copy of that
    state with the turn written in (``Later.source``); the kept state stays as it was."""
    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        origin = await keep(sessions, "t", [user("one"), assistant("1")], [1, 2])
        follower_state = await committed_session(sessions, "t", "f", [9], [HX])
        async with sessions.turn("t", origin.name) as origin_held, sessions.turn("t", "f") as follower:
            await origin_held.start()
            await follower.start()
            turn = planned(prompt=Prompt([4], [4], turn=[user("two")]), follower=follower, retries=IN_SESSION_RECORD, digest="d")
            version = runner.after(turn, origin_held, [assistant("2")], [5], "stop", answered={"message": "2"})
            later, origin_later = follower.later, origin_held.later
        await settle(sessions)
        return version, later, origin_later, follower_state, origin, h.memory(follower_state.native), h.memory(origin.native)

    version, later, origin_later, follower, origin, memory, origin_memory = run(body)
    assert version == 1 and origin_later is None
    assert later.source == origin.name and not later.keep_parent and later.commits == [[4, 5]]
    assert memory == (1, 2, 4, 5) and follower.version == 1  # a copy of the kept state (version 0), then this turn
    assert follower.committed == [message_hash(m) for m in (user("one"), assistant("1"), user("two"), assistant("2"))]
    assert follower.last_turn == {"digest": "d", "key": None, "version": 1, "message": "2"}
    assert origin_memory == (1, 2) and origin.committed == [message_hash(user("one")), message_hash(assistant("1"))]


@pytest.mark.parametrize(("finish", "expected"), [("stop", (1, 2, 3, 5, 6)), ("length", (1, 2, 3, 5, 6, EOS)), ("tool_calls", None)])
def test_a_headerless_turn_forks_the_conversations_next_state(finish, expected):
    """Never written, the state the request read stays; its answer forks the next one (a cut answer closed with the end
    token, as the app's transcript closes it); a function call forks nothing."""
    conversation = [user("one"), assistant("1"), user("two")]
    answer = CALL if finish == "tool_calls" else assistant("2")

    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        parent = await keep(sessions, "t", conversation[:2], [1, 2])
        plan = plan_headerless(conversation, "t", sessions.kept.prefixes)
        assert plan.found == Found(2, parent.name)
        async with sessions.turn("t", parent.name) as held:
            await held.start()
            turn = planned(prompt=Prompt([3], [3], turn=[user("two")]), headerless=plan)
            version = runner.after(turn, held, [answer], [5, 6], finish)
            later = held.later
        await settle(sessions)
        made = [state for state in kept(sessions) if state is not parent]
        link = chain("t", [message_hash(m) for m in (*conversation, answer)])[-1]
        return version, later, made, [h.memory(s.native) for s in made], h.memory(parent.native), sessions.kept.prefixes.find([link])

    version, later, made, memories, parent_memory, found = run(body)
    assert version is None and later is None and parent_memory == (1, 2)
    if expected is None:
        assert made == [] and found is None
    else:
        assert memories == [expected] and found == Found(1, made[0].name)


def test_a_headerless_turn_without_a_state_starts_one_from_its_opening():
    """No kept state, but a conversation worth keeping: its whole history and turn (``MemoryPlan.opening``) and the answer
    start the conversation's first state."""
    conversation = [user("one"), assistant("1"), user("two"), assistant("2"), user("three")]

    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        plan = plan_headerless(conversation, "t", sessions.kept.prefixes)
        assert plan.found is None and plan.worth_keeping

        async def opening():
            return [1, 2, 3, 4, 5]

        turn = planned(prompt=Prompt([1, 2, 3, 4, 5]), headerless=plan, opening=opening)
        runner.after(turn, None, [assistant("3")], [6], "stop")
        await settle(sessions)
        return kept(sessions), [h.memory(s.native) for s in kept(sessions)]

    states, memories = run(body)
    assert memories == [(1, 2, 3, 4, 5, 6)]
    assert states[0].committed == [message_hash(m) for m in (*conversation, assistant("3"))]


def test_answers_are_kept_for_a_retry_only_where_the_memory_plan_says():
    async def body(h):
        runner = TurnRunner(h.sessions, Format())
        answered = {"message": "kept"}
        runner.after(planned("off", digest="d", key="k"), None, [assistant("x")], [1], "stop", answered=answered)
        without = runner.retried("t", "d", True, None)
        runner.after(planned("off", digest="d", key="k", retries=runner.answers), None, [assistant("x")], [1], "stop", answered=answered)
        return (without, runner.retried("t", "d", True, None), runner.retried("t", "d", False, None),
                runner.retried("t", "d", False, "k"), runner.retried("u", "d", True, None))

    without, retry, regenerate, same_key, other_tenant = run(body)
    assert without is None  # no retry store in the plan (a stateless turn): nothing kept
    assert retry == same_key == {"message": "kept"}  # the SDK's retry header, or the same Idempotency-Key
    assert regenerate is None and other_tenant is None  # the same request otherwise is a regenerate


# ---- holding: the session let go when the answer ends


async def _held(sessions, name: str):
    hold = contextlib.AsyncExitStack()
    held = await hold.enter_async_context(sessions.turn("t", name))
    return held, hold


def _turn(made: list):
    async def prepare() -> Turn:
        turn = planned(prompt=Prompt([1, 2], sampling={"max_new_tokens": 3}))
        made.append(turn)
        return turn
    return prepare


def test_an_answer_lets_the_session_go_when_it_ends():
    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        held, hold = await _held(sessions, "a")
        during = []

        async def answer(turn, held):
            during.append(held.state.lock.locked())
            return await runner.generate(turn, held)

        result = await runner.answer(held, hold, _turn([]), Answering(runner, answer), stream=False, create=True)
        state = held.state
        after = (state.lock.locked(), state.users, state.idle_since is not None, state.exists, state.lease is not None)

        async def fails(turn, held):
            raise RuntimeError("the surface failed")

        held, hold = await _held(sessions, "a")
        with pytest.raises(RuntimeError):
            await runner.answer(held, hold, _turn([]), Answering(runner, fails), stream=False)
        return result, during, after, (state.lock.locked(), state.users)

    result, during, after, after_failure = run(body)
    assert len(result["output_ids"]) == 3 and during == [True]
    assert after == (False, 0, True, True, True)  # let go; created and leased beside the answer
    assert after_failure == (False, 0)


def test_a_stream_lets_the_session_go_when_it_ends_or_is_left():
    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        answering = Answering(runner)

        held, hold = await _held(sessions, "a")
        stream = await runner.answer(held, hold, _turn([]), answering, stream=True)
        state = held.state
        before = state.lock.locked()
        bodies = [body async for body in stream]
        await until(lambda: not state.lock.locked() and state.users == 0, what="the session let go after its stream")

        held, hold = await _held(sessions, "a")
        stream = await runner.answer(held, hold, _turn([]), answering, stream=True)
        first = await anext(stream)
        left_locked = state.lock.locked()
        await stream.aclose()  # the client went away after the first body
        await until(lambda: not state.lock.locked() and state.users == 0, what="the session let go after a stream left early")
        return before, bodies, first, left_locked

    before, bodies, first, left_locked = run(body)
    assert before and left_locked  # held while the stream runs
    assert bodies and len(bodies[-1]["output_ids"]) == 3 and first["output_ids"]


def test_a_stream_its_client_left_is_over_upstream_before_the_next_request(tmp_path):
    """Issue 58 item 1: a streamed query left before its end (the client went away; its stream not even closed) is
    cancelled and has ended upstream before the session's next request runs, which is answered (was: 409, the
    departed query still in flight)."""

    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        await committed_session(sessions, "t", "a", [5, 6], [H1])
        answering = Answering(runner)

        async def long() -> Turn:
            return planned(prompt=Prompt([1, 2], sampling={"max_new_tokens": 4000}))

        held, hold = await _held(sessions, "a")
        native = held.state.native
        stream = await runner.answer(held, hold, long, answering, stream=True)
        await anext(stream)  # the client reads a frame and leaves: the stream is dropped where it stands
        running = list(h.native(native).in_flight)
        stream.aclose().close()  # (a client's task cancelled mid-stream never finishes its generators' clean-up)
        asyncio.get_running_loop().create_task(hold.aclose())  # the session let go as ``streaming`` lets it go
        held, hold = await _held(sessions, "a")  # the next request, at once
        try:
            await held.start()
            answer = await runner.generate(planned(prompt=Prompt([1, 2], sampling={"max_new_tokens": 2})), held)
        finally:
            await hold.aclose()
        return running, answer, list(h.native(native).in_flight)

    running, answer, after = run(body, state=tmp_path)
    assert len(running) == 1  # the departed query was in flight when its client left
    assert answer["output_ids"] == [5, 6] and after == []


def test_a_stream_never_started_lets_the_session_go_after_the_start_timeout(monkeypatch):
    monkeypatch.setattr(turn_module, "STREAM_START_TIMEOUT", 0.05)

    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        made = []
        answering = Answering(runner)

        held, hold = await _held(sessions, "a")
        stream = await runner.answer(held, hold, _turn(made), answering, stream=True)
        state = held.state
        before = state.lock.locked()
        await until(lambda: not state.lock.locked() and state.users == 0, what="the unstarted stream's session let go")
        with pytest.raises(Unavailable) as expired:
            await anext(stream)
        async with sessions.turn("t", "a") as again:  # the next request holds it at once
            free = again.state is state
        return before, expired.value, free, h.client.count("query"), h.client.calls

    before, expired, free, queried, calls = run(body, lease_wait=0.5)
    assert before and free
    assert expired.code == "stream_expired" and expired.status == 503
    assert queried == 0 and not any(action == "acquire" for action, _ in calls)  # nothing was generated or leased


# ---- an upstream restart behind the proxy's back (issue 58 item 4)


def _restart_core(h) -> None:
    """The in-process core as a restart leaves it: a new epoch, and no session (no snapshot store)."""
    h.protocol.epoch = "a-new-epoch"
    h.protocol.sessions.clear()
    h.engine.sessions.clear()


def test_a_new_epoch_learned_by_a_check_forgets_what_memory_held():
    """A readiness probe (``check_upstream(refresh=True)``) is the first to see the restarted core: every session starts
    over, so no turn is trimmed on the belief that memory holds its earlier messages (was: kept, and the next turn sent
    without its history to an empty memory)."""

    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [5, 6], [H1])
        before = list(state.committed)
        _restart_core(h)
        await sessions.check_upstream(refresh=True)
        return before, list(state.committed), state.exists, state.version

    before, after, exists, version = run(body)
    assert before == [H1] and after == [] and not exists and version == 0


def test_a_turn_planned_on_memory_that_is_gone_is_planned_again_on_the_new_empty_one():
    """A session let go after a write of unknown outcome still names what memory held; when its next request creates it
    empty upstream (the core lost it), the turn is prepared again, on the empty memory (the whole transcript)."""

    async def body(h):
        sessions = h.sessions
        runner = TurnRunner(sessions, Format())
        state = await committed_session(sessions, "t", "a", [5, 6], [H1])
        h.protocol.sessions.pop(state.native)  # gone upstream (a restart the proxy has not seen)
        h.engine.sessions.pop(state.native)
        state.drop_lease()
        state.let_go()
        seen = []

        async def prepare() -> Turn:
            seen.append(list(state.committed))
            return planned(prompt=Prompt([1, 2], sampling={"max_new_tokens": 2}))

        held, hold = await _held(sessions, "a")
        answer = await runner.answer(held, hold, prepare, Answering(runner), stream=False)
        return seen, answer

    seen, answer = run(body)
    assert seen == [[H1], []]  # planned on the memory it believed in, then again on the memory it found
    assert len(answer["output_ids"]) == 2


# ---- the one entry, and the frozen parts


def test_run_replays_a_kept_answer_and_answers_a_plain_turn_holding_nothing():
    async def body(h):
        runner = TurnRunner(h.sessions, Format())
        answering = Answering(runner)
        replayed = await runner.run(OnMemory(replay={"message": "kept"}), answering, stream=False)
        plain = await runner.run(OnMemory(turn=planned("off", prompt=Prompt([1, 2], sampling={"max_new_tokens": 2}))), answering, stream=False)
        streamed = await runner.run(OnMemory(turn=planned("off", prompt=Prompt([1, 2], sampling={"max_new_tokens": 2}))), answering, stream=True)
        bodies = [body async for body in streamed]
        return replayed, plain, bodies, len(h.sessions.table)

    replayed, plain, bodies, held = run(body)
    assert replayed == {"replayed": {"message": "kept"}}  # nothing generated for a retry
    assert len(plain["output_ids"]) == 2 and len(bodies[-1]["output_ids"]) == 2
    assert held == 0  # no session was held or made


def test_a_turns_parts_are_frozen():
    turn = planned(prompt=Prompt([1]), keep_parent=True)
    for part, field in ((turn, "memory"), (turn.prompt, "ids"), (turn.memory, "keep_parent"), (turn.context, "digest")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, field, None)
    assert dataclasses.replace(turn.memory, keep_parent=False).keep_parent is False and turn.memory.keep_parent  # a new plan, not a change
    # the session layer's turn holds no surface's concept and no progress of a run
    fields = {f.name for part in (Turn, Prompt, MemoryPlan) for f in dataclasses.fields(part)}
    assert not fields & {"request", "thread", "items", "base_version", "as_text", "started", "kept", "tenant", "digest", "key"}
