"""``memt_proxy.session.held`` on the in-process harness: one session held by one request — started (created or
adopted, then leased), found for an admin action (adopted, brought back from an offload, or a 404 that creates
nothing), a turn committed, a snapshot saved and restored under the client's own name, closed with its record and
the states kept for it."""

from __future__ import annotations

from memt_proxy.errors import ProxyError
from session_harness import committed_session, kept, run

H1, H2 = "1" * 64, "2" * 64


def test_a_started_session_is_created_and_leased_and_its_turn_committed():
    async def body(h):
        sessions = h.sessions
        async with sessions.turn("t", "a") as held:
            await held.start()
            started = (held.state.exists, held.lease is not None, held.lease == held.state.lease)
            await held.commit_turn([5], [6, 7], [H1, H2])
        return started, h.memory(held.state.native), held.state.version, list(held.state.committed)

    started, memory, version, committed = run(body)
    assert started == (True, True, True)
    assert memory == (5, 6, 7) and version == 1 and committed == [H1, H2]  # the context, then the turn, in one write


def test_find_adopts_a_session_the_upstream_holds_and_creates_none_it_does_not():
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        restarted = h.life()
        await restarted.check_upstream()
        async with restarted.turn("t", "a") as held:
            native = await held.find("a")
            adopted = (held.state.exists, held.state.version, list(held.state.committed))
        async with restarted.turn("t", "nobody") as held:
            try:
                await held.find("nobody")
            except ProxyError as exc:
                missing = exc
        return native, adopted, missing, h.native(restarted.state("t", "nobody").native), state.native

    native, adopted, missing, created, name = run(body, state=None)
    assert native["published_version"] == 1 and adopted == (True, 1, [])  # without records: what it holds is unknown
    assert missing.status == 404 and missing.code == "session_not_found" and created is None


def test_find_brings_back_an_offloaded_session(tmp_path):
    async def body(h):
        sessions = h.sessions
        a = await committed_session(sessions, "t", "a", [1, 2], [H1])
        await committed_session(sessions, "t", "b", [3], [H2])
        await committed_session(sessions, "t", "c", [4], [H2])  # room for two: a is offloaded
        offloaded = not a.exists
        async with sessions.turn("t", "a") as held:
            native = await held.find("a")
        return offloaded, native, a.exists, h.memory(a.native), list(a.committed)

    offloaded, native, exists, memory, committed = run(body, core=("--max-sessions-per-rank", "2"), state=tmp_path)
    assert offloaded and native is None and exists and memory == (1, 2) and committed == [H1]


def test_a_snapshot_is_saved_and_restored_and_an_error_names_the_clients_file(tmp_path):
    async def body(h):
        sessions = h.sessions
        await committed_session(sessions, "t", "a", [1, 2], [H1])
        async with sessions.turn("t", "a") as held:
            await held.start()
            await held.save("t-file.safetensors", name="mine")
            try:
                await held.save("t-file.safetensors", name="mine")  # exists, not overwritten
            except ProxyError as exc:
                exists = exc
            await held.commit_turn([], [9], [H1, H2])
            await held.restore("t-file.safetensors", name="mine")
            try:
                await held.restore("t-none.safetensors", name="none")
            except ProxyError as exc:
                missing = exc
        return exists, missing, h.memory(held.state.native), list(held.state.committed)

    exists, missing, memory, committed = run(body, state=tmp_path)
    assert "mine" in exists.message and "t-file" not in exists.message
    assert "none" in missing.message and "t-none" not in missing.message
    assert memory == (1, 2) and committed == []  # restored: memory holds no transcript message the proxy knows


def test_a_closed_session_takes_its_record_and_its_kept_states_with_it(tmp_path):
    async def body(h):
        sessions = h.sessions
        state = await committed_session(sessions, "t", "a", [1, 2], [H1])
        async with sessions.turn("t", "a") as held:
            await held.start()
            await sessions.keep_parent(held.state)
            parents = len(kept(sessions))
            await held.close()
        return parents, state.exists, h.native(state.native), sessions.records.known(state.native), kept(sessions)

    parents, exists, native, recorded, left = run(body, state=tmp_path)
    assert parents == 1 and not exists and native is None and not recorded and left == []
