"""``memt_proxy.session.leases`` on the in-process harness: a session's native lease is kept across requests, renewed
while it is active, released once it has been idle ``lease_idle`` seconds; a kept lease that lapsed is retaken once
(``HeldSession._lapsed``); another client's lease is waited for, ``lease_wait`` at most, then 409. Time is a
``StoppedClock`` the tests move (the proxy's and the core's): no test waits for real seconds."""

from __future__ import annotations

import pytest

from memt_core.client.errors import MemTClientError
from memt_core.errors import LeaseConflict
from memt_proxy.errors import ProxyError
from session_harness import StoppedClock, run, until

ONE = {"max_new_tokens": 1}


def test_a_lease_is_kept_across_requests():
    """The second request's start reuses the first one's lease: one acquire, and the upstream still holds it."""
    async def body(h):
        sessions = h.sessions
        async with sessions.turn("t", "a") as first:
            await first.start()
            lease, state = first.lease, first.state
            assert lease is not None and first.kept is False
        assert state.lease == lease and state.keeper is not None and not state.keeper.done()
        assert h.native(state.native).lease.token == lease  # not released upstream between requests
        async with sessions.turn("t", "a") as second:
            await second.start()
            assert second.kept is True and second.lease == lease
            await second.query([1, 2], ONE)
        return h.client.count("acquire", state.native), h.client.count("release", state.native)

    assert run(body) == (1, 0)


def test_an_active_sessions_lease_is_renewed_past_its_ttl():
    """``lease_ttl`` 1 s: a request holding the session for 1.5 s still queries under its first lease, renewed
    every third of the ttl; once idle (but within ``lease_idle``) it is still renewed."""
    async def body(h):
        sessions = h.sessions
        async with sessions.turn("t", "a") as held:
            await held.start()
            lease = held.lease
            await h.clock.advance(1.5)  # past the ttl
            await held.query([1], ONE)  # a first request's lease (not kept): a lapse here would be a 409
            renewed_in_use = h.client.count("renew", held.state.native)
        await h.clock.advance(1.2)
        state = held.state
        return lease, state.lease, renewed_in_use, h.client.count("renew", state.native), h.native(state.native).lease.token

    lease, kept, renewed_in_use, renewed, upstream = run(body, lease_ttl=1, lease_idle=30.0, clock=StoppedClock())
    assert kept == lease == upstream
    # every third of the ttl, at the clock's first step (0.05 s) past it: at 0.35, 0.7, 1.05 and 1.4 s in use,
    assert renewed_in_use == 4
    assert renewed == renewed_in_use + 3  # and on while idle (within lease_idle): at 1.75, 2.1 and 2.45 s


def test_an_idle_sessions_lease_is_released_after_lease_idle():
    async def body(h):
        sessions = h.sessions
        async with sessions.turn("t", "a") as held:
            await held.start()
            lease = held.lease
        state, let_go = held.state, h.clock.now()
        assert state.lease == lease and h.client.count("release") == 0  # not at once
        while state.lease is not None and h.clock.now() - let_go < 3.0:
            await h.clock.advance(0.05)
        idle = h.clock.now() - let_go
        assert state.keeper is None and h.client.count("release", state.native) == 1
        assert h.native(state.native).lease is None  # released upstream: another client may take it now
        other = await h.other_client().control("acquire", state.native, ttl=5)
        return idle, other["lease"] != lease

    idle, another = run(body, lease_idle=0.3, clock=StoppedClock())
    assert 0.3 <= idle < 0.35 and another  # released in the first step past lease_idle


def test_a_request_keeps_the_lease_from_being_released_while_it_runs():
    """The idle clock starts when the last user lets go: a session in use past ``lease_idle`` keeps its lease."""
    async def body(h):
        async with h.sessions.turn("t", "a") as held:
            await held.start()
            await h.clock.advance(0.5)  # > lease_idle, but in use
            assert held.state.lease == held.lease and h.client.count("release") == 0
            await held.query([3], ONE)
        await h.clock.advance(0.15)
        assert held.state.lease is None
        return h.client.count("release")

    assert run(body, lease_idle=0.1, clock=StoppedClock()) == 1


async def _lapse(h, state, lease: str) -> None:
    """The kept ``lease`` lapses behind the proxy's back: its renewals stop and the upstream lets it go."""
    state.keeper.cancel()
    state.keeper = None
    await h.other_client().control("release", state.native, lease=lease)


def test_a_lapsed_kept_lease_is_retaken_once():
    async def body(h):
        sessions = h.sessions
        async with sessions.turn("t", "a") as held:
            await held.start()
            old = held.lease
        state = held.state
        await _lapse(h, state, old)
        async with sessions.turn("t", "a") as held:
            await held.start()
            assert held.kept and held.lease == old  # the proxy does not know yet
            answer = await held.query([1, 2], ONE)  # refused (LeaseConflict), retaken, asked again
            new = held.lease
        return old, new, state.lease, answer, h.client.count("acquire", state.native), h.client.count("query", state.native)

    old, new, kept, answer, acquired, queried = run(body)
    assert new != old and kept == new
    assert answer["output_ids"]
    assert acquired == 2 and queried == 2


def test_a_lease_that_lapses_again_after_the_retake_is_a_409():
    """Once: every query's lease is let go upstream as it is sent; the kept one is retaken, the new one is not."""
    async def body(h):
        sessions = h.sessions
        other = h.other_client()
        async with sessions.turn("t", "a") as held:
            await held.start()
        state = held.state
        state.keeper.cancel()
        state.keeper = None

        async def lapse(action, session, fields):
            await other.control("release", session, lease=fields["lease"])

        h.client.hooks["query"] = lapse
        async with sessions.turn("t", "a") as held:
            await held.start()
            with pytest.raises(ProxyError) as refused:
                await held.query([1], ONE)
        return refused.value, h.client.count("acquire", state.native), h.client.count("query", state.native)

    refused, acquired, queried = run(body)
    assert refused.status == 409
    assert acquired == 2 and queried == 2  # one retake, one more query; no third


def test_a_fresh_lease_that_lapses_is_not_retaken():
    """``_lapsed`` is only for a lease kept from an earlier request: a lease taken by this one failing is a 409."""
    async def body(h):
        sessions = h.sessions
        other = h.other_client()
        async with sessions.turn("t", "a") as held:
            await held.start()
            assert held.kept is False
            await other.control("release", held.state.native, lease=held.lease)
            with pytest.raises(ProxyError) as refused:
                await held.query([1], ONE)
            conflict = MemTClientError("lease", status=409, cause=LeaseConflict("lapsed"))
            assert held._lapsed(conflict) is False
        return refused.value, h.client.count("acquire", held.state.native)

    refused, acquired = run(body)
    assert refused.status == 409 and acquired == 1


def test_another_clients_lease_is_waited_for_lease_wait_then_409():
    async def body(h):
        sessions = h.sessions
        native = sessions.state("t", "a").native
        other = h.other_client()
        await other.control("create", native, memory_read=True)
        await other.control("acquire", native, ttl=60)
        began = h.clock.now()
        async with sessions.turn("t", "a") as held:
            with pytest.raises(ProxyError) as busy:
                await held.start()
        waited = h.clock.now() - began
        return busy.value, waited, h.client.count("acquire", native), held.state.lease

    busy, waited, tries, lease = run(body, lease_wait=0.6, clock=StoppedClock())
    assert busy.status == 409
    assert 0.6 <= waited < 0.9
    assert 4 <= tries <= 5  # tried again while waiting (every 0.2 s: at 0, 0.2, 0.4, 0.6 s and, float sums permitting, 0.8), not refused at once
    assert lease is None


def test_a_lease_let_go_during_the_wait_is_taken():
    async def body(h):
        sessions = h.sessions
        native = sessions.state("t", "a").native
        other = h.other_client()
        await other.control("create", native, memory_read=True)
        theirs = (await other.control("acquire", native, ttl=60))["lease"]

        async def let_go(action, session, fields):  # the other client lets go as the proxy's third try is sent
            if session == native and h.client.count("acquire", native) == 3:
                await other.control("release", native, lease=theirs)

        h.client.hooks["acquire"] = let_go
        async with sessions.turn("t", "a") as held:
            await held.start()
            await held.query([1], ONE)
            ours = held.lease
        return ours, theirs, h.native(native).lease.token, h.client.count("acquire", native)

    ours, theirs, upstream, tries = run(body, lease_wait=5.0, clock=StoppedClock())
    assert ours not in (None, theirs) and upstream == ours and tries == 3
