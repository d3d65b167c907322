"""The proxy's session layer without an upstream: the bounded session table (least recently used idle
state dropped first, states in use never), ``turn()`` holding and letting go, and what a dropped
session finds again when it returns (its record, or an unknown history)."""

from __future__ import annotations

import asyncio

import pytest

from memt_core.client.native import AsyncNativeClient
from memt_proxy.errors import ProxyError
from memt_proxy.session.sessions import SessionTable, Sessions, native_session_id, snapshot_file
from memt_proxy.session.store import SessionRecordStore
from session_harness import turns

A, B, C = "a" * 64, "b" * 64, "c" * 64


def sessions(max_sessions: int, records: SessionRecordStore | None = None) -> Sessions:
    # the upstream is a closed port: nothing here may reach it
    return Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity="x", records=records, max_sessions=max_sessions, lease_wait=5)


def test_the_table_keeps_at_most_its_capacity_least_recently_used_first():
    table = SessionTable(3)
    for name in ("s1", "s2", "s3"):
        table.give_back(table.take("t", name))
    table.give_back(table.take("t", "s1"))  # s1 used again: s2 is now the least recently used
    table.give_back(table.take("t", "s4"))
    assert table.get("t", "s2") is None and {table.get("t", n) is not None for n in ("s1", "s3", "s4")} == {True}
    assert len(table) == 3 and table.dropped == 1
    assert table.take("u", "s1") is not table.get("t", "s1")  # tenants never share a state
    assert table.get("u", "s1").native == native_session_id("u", "s1") != native_session_id("t", "s1")


def test_five_thousand_sessions_through_turn_leave_at_most_max_sessions():
    layer = sessions(64)

    async def scenario():
        async with layer.turn("t", "kept") as kept:  # held the whole time: never dropped
            for number in range(5000):
                async with layer.turn("t", f"s-{number}") as held:
                    assert held.lease is None and held.state.lock.locked()
                assert len(layer.table) <= 64
            assert layer.table.get("t", "kept") is kept.state and kept.state.lock.locked()
        return kept.state

    kept = asyncio.run(scenario())
    assert len(layer.table) == 64 and layer.table.dropped == 5000 + 1 - 64
    assert not kept.lock.locked() and kept.users == 0
    assert all(state.users == 0 and state.keeper is None and not state.lock.locked() for state in layer.table)


def test_when_every_state_is_in_use_a_new_session_is_refused():
    layer = sessions(2)

    async def scenario():
        async with layer.turn("t", "a"), layer.turn("t", "b"):
            with pytest.raises(ProxyError) as refused:
                async with layer.turn("t", "c"):
                    pass
            assert len(layer.table) == 2 and layer.table.get("t", "c") is None
        async with layer.turn("t", "c"):  # a and b are idle again: the least recently used makes room
            pass
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.status == 429 and refused.code == "too_many_sessions" and refused.type == "rate_limit_error"
    assert layer.table.get("t", "a") is None and layer.table.get("t", "b") is not None


def test_a_state_with_a_request_waiting_for_its_lock_is_not_dropped():
    """Dropping it would let a third request make a second state, with a second lock, for the same session."""
    layer = sessions(2)
    order = []

    async def second_request():
        async with layer.turn("t", "a"):
            order.append("second")

    async def scenario():
        async with layer.turn("t", "a") as first:
            waiting = asyncio.ensure_future(second_request())
            while first.state.users < 2:  # the second request now waits for the lock
                await turns()
            async with layer.turn("t", "b"):
                pass
            async with layer.turn("t", "c"):  # makes room by dropping b, the only idle state
                pass
            assert layer.table.get("t", "a") is first.state and layer.table.get("t", "b") is None
            order.append("first")
        await waiting
        return first.state

    state = asyncio.run(scenario())
    assert order == ["first", "second"] and state.users == 0


def test_the_lock_wait_is_bounded():
    layer = sessions(4)
    layer.leases.lease_wait = 0.05

    async def scenario():
        async with layer.turn("t", "a"):
            with pytest.raises(ProxyError) as busy:
                async with layer.turn("t", "a"):
                    pass
        return busy.value

    busy = asyncio.run(scenario())
    assert busy.status == 409 and busy.code == "session_busy"
    assert layer.table.get("t", "a").users == 0


def test_a_dropped_session_finds_its_record_again(tmp_path):
    """What the proxy knew of a dropped session comes back from --state-directory when it is adopted again."""
    layer = sessions(1, SessionRecordStore(tmp_path))
    state = layer.state("t", "a")
    state.exists = True
    layer.writes.changing(state, [A, B])
    layer.writes.changed(state, [A, B])
    layer.state("t", "b")  # makes room: a is dropped
    assert layer.table.get("t", "a") is None
    again = layer.state("t", "a")
    assert again is not state and again.exists is False and again.committed == []
    layer.placement.adopt(again, {"published_version": 1})  # what ``ensure`` does when the native session exists
    assert again.committed == [A, B] and again.history_known is True and again.version == 1
    layer.placement.adopt(again, {"published_version": 2})  # changed since by someone else: unknown
    assert again.committed == [] and again.history_known is False


def test_without_records_a_dropped_session_has_an_unknown_history():
    layer = sessions(1)
    state = layer.state("t", "a")
    state.exists = True
    layer.writes.changing(state, [A, C])
    layer.writes.changed(state, [A, C])
    layer.state("t", "b")
    again = layer.state("t", "a")
    layer.placement.adopt(again, {"published_version": 1})
    assert again.history_known is False and again.committed == [] and again.pending is None


def test_making_room_drops_a_state_without_a_native_session_first():
    """A state whose native session exists is one the proxy may have to offload later: it stays in sight."""
    table = SessionTable(2)
    resident = table.take("t", "resident")
    resident.exists = True
    table.give_back(resident)
    table.give_back(table.take("t", "bare"))  # more recently used, but without a native session
    table.give_back(table.take("t", "new"))
    assert table.get("t", "bare") is None and table.get("t", "resident") is resident


def test_snapshot_names_are_the_tenants_own():
    """The same client name is another upstream file for each tenant, and never an offload snapshot's name."""
    assert snapshot_file("alpha", "notes.safetensors") != snapshot_file("beta", "notes.safetensors")
    assert snapshot_file("alpha", "notes.safetensors").endswith("-notes.safetensors")
    assert snapshot_file("alpha", "sha256-" + "0" * 64 + ".safetensors").startswith("t")
    for bad in ("../x.safetensors", "x.bin", "x" * 200 + ".safetensors"):
        with pytest.raises(ProxyError) as info:
            snapshot_file("alpha", bad)
        assert info.value.status == 400 and info.value.param == "name"


def test_the_table_needs_room_for_one():
    with pytest.raises(ValueError):
        SessionTable(0)


def test_a_session_never_published_to_is_adopted_as_empty():
    """Published version 0: nothing was ever written (e.g. a proxy died between an answer and its commit), record or not."""
    layer = sessions(1)
    state = layer.state("t", "a")
    layer.placement.adopt(state, {"published_version": 0})
    assert state.history_known is True and state.committed == [] and state.exists
