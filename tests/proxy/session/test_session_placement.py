"""``memt_proxy.session.placement`` on the in-process harness: a session created, or adopted with its record (when the
record's version is the upstream's) or as an unknown history (when not); offloaded to make room and restored on
its next use; a session the upstream let go brought back when its lease is taken. The kept states' bound:
``test_session_kept.py``."""

from __future__ import annotations

from memt_core.client.errors import MemTClientError
from memt_core.errors import UnknownSession
from memt_proxy.errors import ProxyError
from session_harness import committed_session, run, write_natively

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64


def test_a_new_session_is_created_and_a_record_of_an_earlier_life_dropped(tmp_path):
    async def body(h):
        sessions = h.sessions
        state = sessions.state("t", "a")
        sessions.records.save(state.native, 4, [H1], [H1, H2])  # left by an earlier life of this id
        await sessions.placement.ensure(state)
        return state, sessions.records.known(state.native), h.native(state.native)

    state, recorded, native = run(body, state=tmp_path)
    assert state.exists and state.version == 0 and state.committed == [] and state.history_known
    assert not recorded and native is not None and native.published_version == 0


def test_a_restarted_proxy_adopts_a_session_with_the_record_of_its_version(tmp_path):
    async def body(h):
        state = await committed_session(h.sessions, "t", "a", [1, 2, 3], [H1, H2])
        restarted = h.life()
        await restarted.check_upstream()
        again = restarted.state("t", "a")
        await restarted.placement.ensure(again)
        return again, h.client.count("create", state.native)

    again, created = run(body, state=tmp_path)
    assert again.exists and again.version == 1 and again.committed == [H1, H2] and again.history_known
    assert created == 1  # by the first proxy; the second found it (SessionExists) and adopted it


def test_a_session_changed_by_someone_else_is_adopted_as_an_unknown_history(tmp_path):
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        await sessions.leases.release(state, state.lease)
        other = h.other_client()
        lease = (await other.control("acquire", state.native, ttl=30))["lease"]
        await write_natively(other, state.native, lease, [9])  # version 2, which no record describes
        await other.control("release", state.native, lease=lease)
        restarted = h.life()
        await restarted.check_upstream()
        again = restarted.state("t", "a")
        await restarted.placement.ensure(again)
        return again

    again = run(body, state=tmp_path)
    assert again.exists and again.version == 2
    assert again.history_known is False and again.committed == []


def test_an_idle_session_is_offloaded_to_make_room_and_restored_on_its_next_use(tmp_path):
    """Room for two native sessions: a third offloads the least recently used idle one (exported, closed, recorded);
    that one's next request brings its memory back (at version 1, what it held still known), offloading another."""
    async def body(h):
        sessions = h.sessions
        a = await committed_session(sessions, "t", "a", [1, 2], [H1])
        b = await committed_session(sessions, "t", "b", [3, 4], [H2])
        c = await committed_session(sessions, "t", "c", [5], [H3])
        offloaded = sessions.records.load_offload(a.native)
        during = dict(a_exists=a.exists, a_native=h.native(a.native), b_exists=b.exists, offloads=sessions.placement.offloads, a_version=a.version,
                      snapshot=(tmp_path / offloaded["file"]).exists())
        deleted = []
        h.client.hooks["delete_snapshot"] = lambda action, session, fields: deleted.append((session, fields["file"]))
        async with sessions.turn("t", "a") as held:
            await held.start()
            answer = await held.query([7], {"max_new_tokens": 4})
        return a, b, c, offloaded, during, answer, h.memory(a.native), sessions, deleted

    a, b, c, offloaded, during, answer, memory, sessions, deleted = run(
        body, core=("--max-sessions-per-rank", "2"), state=tmp_path,
    )
    assert during == {"a_exists": False, "a_native": None, "b_exists": True, "offloads": 1, "a_version": 0, "snapshot": True}
    assert offloaded["committed"] == [H1]
    assert memory == (1, 2) and answer["output_ids"] == [1, 2, 1, 2]  # memory back, and read
    assert a.exists and a.version == 1 and a.committed == [H1] and a.history_known
    assert sessions.placement.restores == 1 and sessions.placement.offloads == 2 and not b.exists  # b, then least recently used, made room
    assert sessions.records.load_offload(a.native) is None  # restored: its offload record is gone
    assert deleted == [(a.native, offloaded["file"])]  # and its snapshot deleted (the fake engine keeps the file)
    assert c.exists


def test_a_session_the_upstream_let_go_is_brought_back_when_its_lease_is_taken(tmp_path):
    """Leases report a session the upstream no longer holds (``NotHeld``: here another client unloaded it to the core's
    snapshot store); ``Placement.acquire`` brings it back (``reload``: created again, adopted at the version the core
    restores — the fake engine keeps no durable memory, so version 0, empty, and what the proxy knew of version 1 is
    dropped; tests/e2e/test_proxy_durable_core.py restores the memory itself) and takes its lease. Brought back once:
    where the upstream still holds no such session, its error is the answer."""
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2, 3], [H1, H2])
        await sessions.leases.release(state, state.lease)
        other = h.other_client()
        lease = (await other.control("acquire", state.native, ttl=30))["lease"]
        await other.control("unload", state.native, lease=lease)
        let_go = h.native(state.native)
        taken = await sessions.placement.acquire(state)
        back = (h.native(state.native), h.memory(state.native), state.version, list(state.committed), taken == state.lease)

        def gone(action, session, fields):  # the upstream says it holds no such session, whatever is done
            raise MemTClientError("acquire: unknown session", stage="acquire", status=404, cause=UnknownSession("unknown session"))

        h.client.hooks["acquire"] = gone
        state.drop_lease()
        created = h.client.count("create", state.native)
        try:
            await sessions.placement.acquire(state)
        except ProxyError as exc:
            refused = exc
        return let_go, back, refused, h.client.count("create", state.native) - created

    let_go, back, refused, created = run(body, state=tmp_path, core=("--snapshot-store", str(tmp_path / "store")))
    assert let_go is None
    native, memory, version, committed, leased = back
    assert native is not None and memory == () and version == 0 and committed == [] and leased
    assert "unknown session" in refused.message and created == 1  # brought back once (its create), then the upstream's answer
