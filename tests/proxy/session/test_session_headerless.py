"""``memt_proxy.session.headerless`` on the in-process harness: ``plan_headerless`` finds the deepest kept state a
request's earlier messages reach (its tenant's only); ``after_answer`` forks one state, written once, however many
identical answers ask for it; ``resume`` looks again when the state it found was closed before it held it."""

from __future__ import annotations

import asyncio

from memt_proxy.session.headerless import after_answer, plan_headerless, resume, resumable
from memt_proxy.session.prefix_index import Found, PrefixIndex, chain
from memt_proxy.session.state import native_session_id
from memt_proxy.session.transcript import message_hash
from session_harness import kept, kept_state, run, settle, turns, until


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "Be brief."}
CONVERSATION = [user("one"), assistant("1"), user("two"), assistant("2"), user("three")]
HASHES = [message_hash(m) for m in CONVERSATION]


async def keep(sessions, tenant: str, messages: list[dict], ids: list[int]):
    return await kept_state(sessions, tenant, [message_hash(m) for m in messages], ids)


def test_plan_headerless_finds_the_deepest_kept_state_of_the_earlier_messages():
    prefixes = PrefixIndex()
    links = chain("t", HASHES)
    prefixes.move("~shallow", links[1])  # holds one, 1
    prefixes.move("~deep", links[3])  # holds one, 1, two, 2
    prefixes.move("~whole", links[4])  # holds the last user message too: not an earlier message, never resumed
    plan = plan_headerless([SYSTEM, *CONVERSATION], "t", prefixes)  # a system message is no part of the chain
    assert plan.found == Found(4, "~deep")
    assert plan.hashes == HASHES[:4] and plan.links == tuple(links[:4]) and plan.link == links[4]
    assert plan.conversation == tuple(HASHES) and plan.worth_keeping is False
    prefixes.drop("~deep")
    assert plan_headerless(CONVERSATION, "t", prefixes).found == Found(2, "~shallow")
    assert plan_headerless(CONVERSATION, "u", prefixes).found is None  # another tenant's chain: nothing
    edited = [user("one"), assistant("1"), user("TWO"), assistant("2"), user("three")]
    assert plan_headerless(edited, "t", prefixes).found == Found(2, "~shallow")  # an edit of message 3 resumes before it


def test_plan_headerless_keeps_a_conversation_only_when_it_continues():
    prefixes = PrefixIndex()
    one_shot = plan_headerless([user("title this")], "t", prefixes)
    assert one_shot.found is None and one_shot.worth_keeping is False and one_shot.hashes == []
    second = plan_headerless(CONVERSATION[:3], "t", prefixes)  # one earlier exchange, not answered here
    assert second.found is None and second.worth_keeping is False
    prefixes.answered(chain("t", HASHES[:2])[-1])  # this proxy answered "one"
    assert plan_headerless(CONVERSATION[:3], "t", prefixes).worth_keeping is True
    assert plan_headerless(CONVERSATION, "u", PrefixIndex()).worth_keeping is True  # two earlier exchanges
    ended = plan_headerless(CONVERSATION[:2], "t", prefixes)  # ends with the assistant: no turn
    assert ended.found is None and ended.worth_keeping is False


def test_twenty_identical_answers_fork_one_state_written_once():
    """Twenty requests continuing the same kept state get the same answer at once (and ten more once its state is
    made): one new state, one copy of the parent, one write; the parent is left as it was."""
    async def body(h):
        sessions = h.sessions
        parent = await keep(sessions, "t", CONVERSATION[:2], [1, 2])
        writes_before, copies_before = sessions.writes.published, h.client.count("create")
        plan = plan_headerless(CONVERSATION[:3], "t", sessions.kept.prefixes)
        assert plan.found == Found(2, parent.name)
        answer = [assistant("2")]
        release = asyncio.Event()
        asked = []

        async def ids():
            asked.append(1)
            await release.wait()  # the first fork is under way while the others answer
            return [3, 4, 5]

        async def answered(index: int):
            await turns(index % 5)
            after_answer(sessions, plan, answer, parent=parent, keep=True, ids=ids)

        await asyncio.gather(*(answered(index) for index in range(20)))
        link = chain("t", [*HASHES[:3], message_hash(answer[0])])[-1]
        assert sessions.kept.prefixes.being_made(link) is not None and len(sessions.behind) == 1  # one fork under way
        release.set()
        await settle(sessions)
        await asyncio.gather(*(answered(index) for index in range(10)))  # after it is made: found, not made again
        await settle(sessions)
        made = [state for state in kept(sessions) if state is not parent]
        return (parent, made, sessions.writes.published - writes_before, h.client.count("create") - copies_before, len(asked),
                [h.memory(state.native) for state in made], h.memory(parent.native), sessions.kept.prefixes.find(chain("t", [*HASHES[:3], message_hash(answer[0])])))

    parent, made, writes, creates, asked, memories, parent_memory, found = run(body)
    assert len(made) == 1 and writes == 1 and creates == 1 and asked == 1
    assert memories == [(1, 2, 3, 4, 5)]  # a copy of the parent, and what it lacked
    assert made[0].committed == [*HASHES[:3], message_hash(assistant("2"))]
    assert found == Found(4, made[0].name)
    assert parent_memory == (1, 2) and parent.exists and parent.committed == HASHES[:2]  # never written once made


def test_a_conversations_next_request_waits_for_the_state_its_answer_makes():
    """``planned`` (through ``resume``): a request whose history is being kept waits for it and reads it."""
    async def body(h):
        sessions = h.sessions
        plan = plan_headerless(CONVERSATION[:3], "t", sessions.kept.prefixes)
        release = asyncio.Event()

        async def ids():
            await release.wait()
            return [1, 2, 3, 4]

        waiting = asyncio.Event()
        being_made = sessions.kept.prefixes.being_made

        class Watched:  # the state being made, as the request sees it: it says when the request waits for it
            def __init__(self, event: asyncio.Event):
                self.event = event

            async def wait(self):
                waiting.set()
                await self.event.wait()

        sessions.kept.prefixes.being_made = lambda link: None if (event := being_made(link)) is None else Watched(event)
        sessions.kept.prefixes.answered(plan.links[-1])
        after_answer(sessions, plan, [assistant("2")], parent=None, keep=True, ids=ids)
        following = asyncio.create_task(resume(sessions, [*CONVERSATION[:4], user("three")], "t", 10))
        await waiting.wait()  # the request found its history being kept and waits for it
        await turns(20)
        assert not following.done()
        release.set()
        found, held, hold = await following
        name = held.state.name
        await hold.aclose()
        return found.found, name

    found, name = run(body)
    assert found.depth == 4 and found.name == name


def test_resume_looks_again_when_the_state_it_found_was_closed():
    """A request finds the deep state, which is closed (to make room) while the request waits for its lock: it looks
    again and resumes from the shallower one."""
    async def body(h):
        sessions = h.sessions
        shallow = await keep(sessions, "t", CONVERSATION[:2], [1, 2])
        deep = await keep(sessions, "t", CONVERSATION[:4], [1, 2, 3, 4])
        async with sessions.turn("t", deep.name) as holding:
            request = asyncio.create_task(resume(sessions, CONVERSATION, "t", 10))
            await until(lambda: deep.users == 2, what="the request waiting for the deep state")
            assert await sessions.kept.close(holding.state)
        plan, held, hold = await request
        try:
            return plan.found, held.state.name, held.state.committed, shallow, deep, h.native(deep.native)
        finally:
            await hold.aclose()

    found, name, committed, shallow, deep, native = run(body)
    assert found == Found(2, shallow.name) and name == shallow.name and committed == HASHES[:2]
    assert not deep.exists and native is None


def test_a_state_that_moved_on_is_not_resumed_and_the_index_learns_what_it_holds():
    async def body(h):
        sessions = h.sessions
        state = await keep(sessions, "t", CONVERSATION[:2], [1, 2])
        plan = plan_headerless(CONVERSATION, "t", sessions.kept.prefixes)
        state.committed = [message_hash(user("other")), message_hash(assistant("x"))]  # holds another conversation now
        async with sessions.turn("t", state.name) as held:
            ok = await resumable(sessions, held.state, plan)
        return ok, sessions.kept.prefixes.head(state.name), chain("t", state.committed)[-1], plan_headerless(CONVERSATION, "t", sessions.kept.prefixes).found

    ok, head, expected, found = run(body)
    assert ok is False and head == expected and found is None


def test_a_state_gone_upstream_is_dropped_from_the_index():
    """A recorded state the upstream no longer holds (e.g. closed by a proxy before a restart): not made again."""
    async def body(h):
        sessions = h.sessions
        state = await keep(sessions, "t", CONVERSATION[:2], [1, 2])
        await sessions.upstream.client.control("close", state.native, lease=state.drop_lease())
        state.let_go()
        plan = plan_headerless(CONVERSATION, "t", sessions.kept.prefixes)
        async with sessions.turn("t", state.name) as held:
            ok = await resumable(sessions, held.state, plan)
        return ok, sessions.kept.prefixes.head(state.name), h.native(state.native)

    ok, head, native = run(body)
    assert ok is False and head is None and native is None


class Killed(BaseException):
    """The proxy process dies here (kill -9): no ``except``/``finally`` of the proxy's own cleans anything upstream."""


def test_a_proxy_killed_while_a_state_is_made_leaves_no_native_session_without_a_record(tmp_path):
    """Issue 45 item 6: a kept state is recorded before its native session is created, so a proxy killed between the
    create and the state's first write leaves nothing on the core that a restarted proxy does not adopt or forget."""
    async def body(h):
        sessions = h.sessions
        parent = await keep(sessions, "t", CONVERSATION[:2], [1, 2])
        created = []
        h.client.hooks["create"] = lambda action, session, fields: created.append(session)

        def die(action, session, fields):
            if session in created and session != parent.native:
                raise Killed()

        h.client.hooks["acquire"] = die  # the first request after the new state's create: the proxy dies there

        async def ids():
            return [3, 4]

        plan = plan_headerless(CONVERSATION[:3], "t", sessions.kept.prefixes)
        after_answer(sessions, plan, [assistant("2")], parent=parent, keep=True, ids=ids)
        await asyncio.gather(*set(sessions.behind), return_exceptions=True)
        restarted = h.life()  # the next proxy, on the same records
        await restarted.check_upstream()
        known = {state.native for state in restarted.table} | set(restarted.records.sessions())
        return created, h.proxy_sessions(), known

    created, upstream, known = run(body, state=tmp_path)
    assert len(created) == 1  # the state was made upstream before the proxy died
    assert upstream <= known, f"native sessions no record names: {sorted(upstream - known)}"


def test_every_kept_state_is_recorded_and_adopted_by_a_restarted_proxy(tmp_path):
    """A conversation's first state (from its opening: no parent) and the state forked from it are both recorded as
    kept states (their kept-state records, not only their session records): a restarted proxy takes both into its table, so
    they count against the bound and are closed to make room like any other."""
    async def body(h):
        sessions = h.sessions

        async def ids():
            return [1, 2, 3, 4]

        first = plan_headerless(CONVERSATION[:3], "t", sessions.kept.prefixes)
        after_answer(sessions, first, [assistant("2")], parent=None, keep=True, ids=ids)
        await settle(sessions)
        parent = kept(sessions)[0]
        second = plan_headerless([*CONVERSATION[:4], user("three")], "t", sessions.kept.prefixes)
        after_answer(sessions, second, [assistant("3")], parent=parent, keep=True, ids=ids)
        await settle(sessions)
        made = {state.native for state in kept(sessions)}
        recorded = {native_session_id(b["tenant"], b["name"]) for b in sessions.records.kept_states()}
        restarted = h.life()
        await restarted.check_upstream()
        adopted = {state.native for state in restarted.table if state.is_kept and state.exists}
        return made, recorded, adopted, h.proxy_sessions()

    made, recorded, adopted, upstream = run(body, state=tmp_path)
    assert len(made) == 2 and upstream == made
    assert recorded == made, f"kept states without a kept-state record: {sorted(made - recorded)}"
    assert adopted == made
