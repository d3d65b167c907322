"""``memt_proxy.session.writes`` on the in-process harness: a turn committed behind its answer publishes, its record
written before the change (``changing``: this version and the next) and after (``changed``); a failed write leaves
memory and the record as they were; ``pieces`` cuts a turn at the upstream's max_prefill_tokens."""

from __future__ import annotations

import asyncio
import threading

import pytest

from memt_core.client.errors import MemTClientError
from memt_proxy.session.store import SessionRecordStore
from session_harness import committed_session, run, settle, until

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64


def test_a_commit_behind_the_answer_publishes_and_records_before_and_after(tmp_path):
    async def body(h):
        sessions = h.sessions
        at_publish = {}

        def publishing(action, session, fields):
            state = sessions.table.get("t", "a")
            at_publish.update(
                version=state.version, committed=list(state.committed), memory=h.memory(session),
                before=sessions.records.load(session, 0), after=sessions.records.load(session, 1),
            )

        h.client.hooks["publish"] = publishing
        h.engine.hold = threading.Event()  # the engine's commits wait: the next request comes while this one is written
        async with sessions.turn("t", "a") as held:
            await held.start()
            held.commit_turn_later([1, 2], [3, 4, 5], [H1, H2])
            state = held.state
        assert state.committing is not None and state.lock.locked()  # the lock went to the commit

        seen = {}

        async def next_request():
            async with sessions.turn("t", "a") as again:
                seen.update(version=again.state.version, committed=list(again.state.committed))

        waiting = asyncio.create_task(next_request())
        await until(lambda: state.users == 2, what="the next request waiting for the commit")
        assert not waiting.done() and state.version == 0
        h.engine.hold.set()
        await waiting
        return state, at_publish, seen, sessions.writes.published, h.memory(state.native), h.client.calls

    state, at_publish, seen, writes, memory, calls = run(body, state=tmp_path)
    # before publish: the record says what this version holds and what the next will; nothing changed yet
    assert at_publish == {"version": 0, "committed": [], "memory": (), "before": [], "after": [H1, H2]}
    # after: published, and the next request saw it
    assert seen == {"version": 1, "committed": [H1, H2]}
    assert state.version == 1 and state.committed == [H1, H2] and state.committing is None
    assert memory == (1, 2, 3, 4, 5) and writes == 1
    assert [a for a, _ in calls if a in ("begin", "commit", "publish")] == ["begin", "commit", "commit", "publish"]
    records = SessionRecordStore(tmp_path / "records")
    assert records.load(state.native, 1) == [H1, H2]
    assert not state.lock.locked() and state.users == 0


@pytest.mark.parametrize("stage", ["commit", "publish"])
def test_a_failed_commit_leaves_memory_and_the_record_as_they_were(tmp_path, stage):
    """The upstream refuses the second turn's commit (or its publish): memory, version and what the proxy knows
    stay those of the first turn, the lease is released (abandoning the transaction), and a proxy restarted now
    adopts the session as holding the first turn."""
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        record = (tmp_path / "records" / f"{state.native}.json").read_text()

        def refuse(action, session, fields):
            raise MemTClientError("injected refusal", stage=stage, status=503)

        h.client.hooks[stage] = refuse
        async with sessions.turn("t", "a") as held:
            await held.start()
            held.commit_turn_later([], [3, 4], [H1, H2])
        await settle(sessions)
        del h.client.hooks[stage]
        after = (tmp_path / "records" / f"{state.native}.json").read_text()
        restarted = h.life()
        await restarted.check_upstream()
        again = restarted.state("t", "a")
        await restarted.placement.ensure(again)
        native = h.native(state.native)
        return state, record, after, h.memory(state.native), native.published_version, native.lease, native.transaction, again, sessions.writes.published

    state, record, after, memory, version, upstream_lease, transaction, again, writes = run(body, state=tmp_path)
    assert memory == (1, 2) and version == 1
    assert state.version == 1 and state.committed == [H1] and state.exists and writes == 1
    assert state.lease is None and upstream_lease is None and transaction is None  # released, nothing left open
    if stage == "commit":
        assert after == record  # the record is written only before publish
    assert again.version == 1 and again.committed == [H1] and again.history_known


def test_a_failed_commit_goes_in_with_the_next_turn():
    """What a failed commit meant to write is not lost: the session's next commit writes it (the app resends it)."""
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1], [H1])

        def refuse(action, session, fields):
            raise MemTClientError("injected refusal", stage="commit", status=503)

        h.client.hooks["commit"] = refuse
        async with sessions.turn("t", "a") as held:
            await held.start()
            held.commit_turn_later([], [2], [H1, H2])
        await settle(sessions)
        del h.client.hooks["commit"]
        async with sessions.turn("t", "a") as held:
            await held.start()  # a new lease (the failed write's was released)
            held.commit_turn_later([2], [3], [H1, H2, H3])
        await settle(sessions)
        return state, h.memory(state.native)

    state, memory = run(body)
    assert memory == (1, 2, 3) and state.committed == [H1, H2, H3] and state.version == 2


def test_pieces_cut_at_max_prefill_tokens_in_whole_chunks():
    async def body(h):
        return h.sessions

    sessions = run(body)
    sessions.upstream.max_prefill_tokens, sessions.upstream.chunk_tokens = None, 128
    assert sessions.upstream.pieces(list(range(5000))) == [list(range(5000))]
    sessions.upstream.max_prefill_tokens = 300
    assert sessions.upstream.pieces(list(range(300))) == [list(range(300))]
    pieces = sessions.upstream.pieces(list(range(700)))
    assert [len(p) for p in pieces] == [256, 256, 188] and sum(pieces, []) == list(range(700))
    sessions.upstream.chunk_tokens = None  # a server that does not say: cut at the limit itself
    assert [len(p) for p in sessions.upstream.pieces(list(range(700)))] == [300, 300, 100]


def test_a_turn_longer_than_max_prefill_tokens_is_written_in_pieces_of_one_transaction():
    """The core refuses a commit over --max-prefill-tokens (128 here, one chunk): a 300-token turn goes in as
    three commits of one transaction, one publish, and memory holds all of it."""
    async def body(h):
        sessions = h.sessions
        assert sessions.upstream.max_prefill_tokens == 128
        sizes = []
        h.client.hooks["commit"] = lambda action, session, fields: sizes.append(len(fields["ids"]))
        ids = [i % 500 + 1 for i in range(300)]
        state = await committed_session(sessions, "t", "a", ids, [H1])
        return sizes, h.client.count("begin"), h.client.count("publish"), h.memory(state.native), ids, state.version

    sizes, begins, publishes, memory, ids, version = run(body, core=("--max-prefill-tokens", "128"))
    assert sizes == [128, 128, 44] and begins == publishes == 1
    assert memory == tuple(ids) and version == 1
