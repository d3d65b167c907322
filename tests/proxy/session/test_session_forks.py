"""``memt_proxy.session.forks`` on the in-process harness: the state a named session's memory held kept before a
change (a copy, indexed by the chain of its messages, recorded with its origin, closed with it, never at the cost of
the table's last place), and a session made a copy of the kept state a diverging request was answered from."""

from __future__ import annotations

from memt_proxy.errors import ProxyError
from memt_proxy.session.prefix_index import Found, chain
from memt_proxy.session.store import SessionRecordStore
from session_harness import committed_session, kept, kept_state, run

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64


def test_only_a_known_history_on_a_leased_session_with_room_is_kept_once_at_a_time():
    """``parent_link``: the chain of what the session holds, reserved; None for an empty or unknown memory, a session
    not leased, or the same messages being kept already (until ``made`` ends the reservation)."""
    async def body(h):
        sessions = h.sessions
        forks = sessions.forks
        state = await committed_session(sessions, "t", "a", [1, 2], [H1, H2])
        empty = sessions.state("t", "e")
        async with sessions.turn("t", "a") as held:
            await held.start()
            link = forks.parent_link(state)
            again = forks.parent_link(state)  # reserved: being kept
            sessions.kept.made(link)
            after = forks.parent_link(state)
            sessions.kept.made(after)
            state.history_known = False
            unknown = forks.parent_link(state)
            state.history_known = True
        lease, state.lease = state.lease, None
        unleased = forks.parent_link(state)
        state.lease = lease
        return link, again, after, unknown, unleased, forks.parent_link(empty)

    link, again, after, unknown, unleased, empty = run(body)
    assert link == chain("t", [H1, H2])[-1] and again is None and after == link
    assert unknown is None and unleased is None and empty is None


def test_a_session_is_rebuilt_as_a_copy_of_the_kept_state_it_follows():
    """``Sessions.rebuild``: the named session's native session closed and made again as a copy of the kept state (its
    memory, at version 0, what it holds known), its last answer kept for a retry, its lease taken; the kept state as it
    was. A kept state gone meanwhile is refused (state_gone), the session left as it was."""
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2, 3, 4], [H1, H2, H3])
        source = await kept_state(sessions, "t", [H1], [1, 2])
        state.last_turn = {"digest": "d"}
        old = state.native
        async with sessions.turn("t", "a") as held:
            await held.start()
            await sessions.rebuild(held.state, source.name)
            rebuilt = (h.memory(state.native), state.version, list(state.committed), state.history_known, state.last_turn, state.lease is not None)
        gone = await kept_state(sessions, "t", [H2], [7])
        await sessions.kept.close(gone)
        async with sessions.turn("t", "a") as held:
            await held.start()
            try:
                await sessions.rebuild(held.state, gone.name)
            except ProxyError as exc:
                refused = exc
        return old, state.native, rebuilt, h.memory(source.native), list(source.committed), refused, h.memory(state.native)

    old, native, rebuilt, source_memory, source_committed, refused, after = run(body)
    assert native == old  # the same session, made again
    assert rebuilt == ((1, 2), 0, [H1], True, {"digest": "d"}, True)
    assert source_memory == (1, 2) and source_committed == [H1]  # never written once made
    assert refused.code == "state_gone" and after == (1, 2)


def test_keep_parent_copies_a_sessions_memory_and_indexes_it(tmp_path):
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2, 3], [H1, H2])
        sessions.memory_tokens.wrote(state, 2, 3)
        async with sessions.turn("t", "a") as held:
            await held.start()
            await sessions.keep_parent(held.state)
            again = len(kept(sessions))
            await sessions.keep_parent(held.state)  # the same memory is kept once
            twice = len(kept(sessions))
        parents = kept(sessions)
        parent = parents[0]
        record = [b for b in sessions.records.kept_states() if b["name"] == parent.name]
        return (state, parent, again, twice, h.memory(parent.native), sessions.kept.prefixes.find(chain("t", [H1, H2])), record,
                sessions.records.load(parent.native, 0), sessions.memory_tokens.held(parent), h.memory(state.native))

    state, parent, once, twice, memory, found, record, recorded, tokens, own = run(body, state=tmp_path)
    assert once == twice == 1
    assert parent.origin == state.native and parent.committed == [H1, H2] and parent.version == 0 and parent.exists
    assert memory == (1, 2, 3) and own == (1, 2, 3)  # a copy; the session's own memory untouched
    assert found == Found(2, parent.name)
    assert record == [{"tenant": "t", "name": parent.name, "head": chain("t", [H1, H2])[-1], "origin": state.native}]
    assert recorded == [H1, H2] and tokens == 3


def test_closing_a_session_closes_the_states_kept_for_it(tmp_path):
    async def body(h):
        sessions = h.sessions
        await committed_session(sessions, "t", "a", [1, 2], [H1])
        async with sessions.turn("t", "a") as held:
            await held.start()
            await sessions.keep_parent(held.state)
        parent = kept(sessions)[0]
        await sessions.admin("t", "a", "close")
        return parent, h.native(parent.native), sessions.kept.prefixes.find(chain("t", [H1])), SessionRecordStore(tmp_path / "records").kept_states()

    parent, native, found, branches = run(body, state=tmp_path)
    assert not parent.exists and native is None and found is None and branches == []


def test_a_state_kept_before_a_turn_never_takes_the_tables_last_place(tmp_path):
    """With --max-sessions 2 and a session held, keeping the state before its turn would take the table's last place
    (a concurrent request on another session would get 429 too_many_sessions): nothing is kept, and the other
    session is served. With room, the state is kept."""
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2, 3], [H1, H2])
        async with sessions.turn("t", "a") as held:
            await held.start()
            room = sessions.table.room()
            await sessions.keep_parent(held.state)
            tight = len(kept(sessions))
            async with sessions.turn("t", "b") as other:  # another client's session: served, not refused
                await other.start()
        roomy = h.life(max_sessions=8)
        await roomy.check_upstream()
        await committed_session(roomy, "t", "c", [4, 5], [H1])
        async with roomy.turn("t", "c") as held:
            await held.start()
            await roomy.keep_parent(held.state)
        return room, tight, state, len(kept(roomy))

    room, tight, state, roomy = run(body, state=tmp_path, max_sessions=2)
    assert room == 1 and tight == 0  # the held session's place, and one left: a request's
    assert roomy == 1
