"""``memt_proxy.session.kept`` on the in-process harness: kept states stay within their bound however many are made at
once (closed to make room, or refused while all are in use); the bound is the proxy's own; a kept state that cannot be
closed now stays, still counted; a restarted proxy takes over the states an earlier life recorded, forgets those gone
upstream and closes those past the bound; a state is made for a chain once (``reserve``/``made``), and one that could not
be made is found no more (``abandon``)."""

from __future__ import annotations

import asyncio
import random

from memt_proxy.errors import ProxyError
from memt_proxy.session.prefix_index import chain
from memt_proxy.session.state import new_kept_name
from session_harness import kept, kept_state, run, turns

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64


def test_kept_states_stay_within_the_bound_however_many_are_made_at_once():
    """Twelve states made at once, each held a moment after it is made, with room for three: never more than three
    kept (none made beyond it: closed to make room, or refused while all three are in use)."""
    async def body(h):
        sessions = h.sessions
        seen, made, refused = [], [], []
        done = asyncio.Event()

        async def watch():
            while not done.is_set():
                seen.append((len(kept(sessions)), len(h.proxy_sessions())))
                await turns()

        async def make(index: int):
            await turns(random.randrange(20))
            async with sessions.turn("t", new_kept_name()) as held:
                try:
                    async with sessions.kept.room(held.state):
                        await held.start()
                except ProxyError as exc:
                    refused.append((exc.status, exc.code, held.state.exists))
                    return
                made.append(held.state)
                await turns(random.randrange(20))

        random.seed(45)
        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(make(index) for index in range(12)))
        done.set()
        await watcher
        return seen, made, refused, len(kept(sessions)), sessions.kept.closed, h.proxy_sessions()

    seen, made, refused, left, closed, upstream = run(body, max_memory_states=3)
    assert max(k for k, _ in seen) <= 3 and max(u for _, u in seen) <= 3, max(seen)
    assert left == 3 and len(upstream) == 3
    assert len(made) + len(refused) == 12 and closed == len(made) - 3
    assert all(r == (429, "memory_states_full", False) for r in refused)


def test_the_bound_is_the_proxys_own():
    """Sized from memory (``--memory-states-budget``), not from the upstream's sessions (it was half of them, 32 of the demo
    core's 64, too few for 32 live conversations: issue 58): a full upstream closes an idle state to make room instead."""
    async def body(h):
        return h.sessions.kept.limit()

    assert run(body, core=("--max-sessions-per-rank", "10"), max_memory_states=256) == 256
    assert run(body, core=("--max-sessions-per-rank", "10"), max_memory_states=3) == 3


def test_a_kept_state_that_cannot_be_closed_now_is_kept_and_counted(tmp_path):
    """Another client holds the state's lease (e.g. a proxy killed a moment ago): closing it fails and the state stays,
    with its record and its native session (found no more, but still counted, so no state is made past the bound);
    once the lease is let go it closes."""
    async def body(h):
        sessions = h.sessions
        state = await kept_state(sessions, "t", [H1], [1, 2])
        await sessions.leases.release(state, state.lease)
        other = h.other_client()
        theirs = (await other.control("acquire", state.native, ttl=60))["lease"]
        async with sessions.turn("t", state.name):
            closed = await sessions.kept.close(state)
        snapshot = dict(
            closed=closed, exists=state.exists, record=sessions.records.known(state.native),
            branch=[b["name"] for b in sessions.records.kept_states()], native=h.native(state.native) is not None,
            found=sessions.kept.prefixes.find(chain("t", [H1])), counted=sessions.kept.closed,
        )
        newcomer = sessions.state("t", new_kept_name())
        room = await sessions.kept.make_room(newcomer)
        await other.control("release", state.native, lease=theirs)
        async with sessions.turn("t", state.name):
            closed_later = await sessions.kept.close(state)
        return state, snapshot, room, closed_later, sessions, h.native(state.native)

    state, snapshot, room, closed_later, sessions, native = run(body, state=tmp_path, max_memory_states=1)
    assert snapshot == {"closed": False, "exists": True, "record": True, "branch": [state.name], "native": True, "found": None, "counted": 0}
    assert room is False  # the bound (1) counts it
    assert closed_later and not state.exists and native is None
    assert not sessions.records.known(state.native) and sessions.records.kept_states() == [] and sessions.kept.closed == 1



def test_a_restarted_proxy_takes_over_the_recorded_states_forgets_those_gone_and_closes_those_past_the_bound(tmp_path):
    """Three kept states recorded by a proxy that then went away, one of them closed upstream since by another client:
    the next proxy, bound to one state, forgets the one gone (no record, not found), adopts the other two and closes one
    of them, so that no more states stay upstream than its bound."""
    async def body(h):
        sessions = h.sessions
        states = [await kept_state(sessions, "t", [hash_], [index + 1, index + 2]) for index, hash_ in enumerate((H1, H2, H3))]
        for state in states:
            await sessions.leases.release(state, state.drop_lease())
        gone, other = states[0], h.other_client()
        lease = (await other.control("acquire", gone.native, ttl=60))["lease"]
        await other.control("close", gone.native, lease=lease)
        later = h.life(max_memory_states=1)
        await later.check_upstream()
        left = kept(later)
        return dict(
            left=[state.native for state in left], closed=later.kept.closed, upstream=h.proxy_sessions(),
            records=sorted(b["name"] for b in later.records.kept_states()), gone_found=later.kept.prefixes.find(chain("t", [H1])),
            gone_recorded=later.records.known(gone.native),
        ), states

    seen, states = run(body, state=tmp_path)
    assert len(seen["left"]) == 1 and seen["left"][0] in {states[1].native, states[2].native}
    assert seen["closed"] == 1 and seen["upstream"] == set(seen["left"])
    survivor = next(state for state in states if state.native == seen["left"][0])
    assert seen["records"] == [survivor.name] and seen["gone_found"] is None and not seen["gone_recorded"]


def test_a_state_is_reserved_once_per_chain_and_one_that_could_not_be_made_is_abandoned(tmp_path):
    async def body(h):
        sessions = h.sessions
        link, other = chain("t", [H1])[-1], chain("t", [H2])[-1]
        first, again, elsewhere = sessions.kept.reserve(link), sessions.kept.reserve(link), sessions.kept.reserve(other)
        sessions.kept.made(link)
        after = sessions.kept.reserve(link)  # given up (never made): it may be made again
        sessions.kept.made(link)
        sessions.kept.made(other)
        made = await kept_state(sessions, "t", [H1], [1, 2])
        kept_already = sessions.kept.reserve(link)  # a state holds that chain already
        unmade = sessions.state("t", new_kept_name())  # indexed and recorded before it exists upstream, then given up
        sessions.kept.move(unmade, other)
        recorded = unmade.name in [b["name"] for b in sessions.records.kept_states()]
        await sessions.kept.abandon(unmade)
        async with sessions.turn("t", made.name):
            await sessions.kept.abandon(made)  # made, but its write failed: closed
        still = unmade.name in [b["name"] for b in sessions.records.kept_states()]
        return (first, again, elsewhere, after, kept_already, recorded, still, sessions.kept.prefixes.find([other]),
                made.exists, sessions.kept.findable(), h.native(made.native))

    first, again, elsewhere, after, kept_already, recorded, still, found, exists, findable, native = run(body, state=tmp_path)
    assert first and not again and elsewhere and after  # one state per chain at a time
    assert not kept_already
    assert recorded and not still and found is None  # abandoned before it existed: its record dropped, found no more
    assert not exists and native is None and findable == 0  # abandoned once made: closed upstream


def test_a_full_table_reserves_no_state():
    """The table's last place is a request's, never a kept copy's."""
    async def body(h):
        return h.sessions.kept.reserve(chain("t", [H1])[-1])

    assert run(body, max_sessions=1) is False
