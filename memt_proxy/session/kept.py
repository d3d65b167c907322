"""Kept states: the native sessions the proxy keeps of a conversation's memory, found by the chain of the messages they
hold (``memt_proxy.session.prefix_index``) and never written once made — a header-less conversation's states
(``memt_proxy.session.headerless``) and the state a named session held before each change (``memt_proxy.session.forks``).

This part holds them within their bound, and their index: the ``PrefixIndex`` is its own, read by the header-less plan
(``prefixes``) and changed only here:

* ``reserve(link)`` / ``made(link)``: a new kept state for the messages whose chain is ``link`` is to be made (not the
  table's last place, and none kept or being made for them already), until it is made or given up; ``answered(link)``:
  a transcript answered (a request carrying it is worth keeping); ``found_elsewhere(links)``: a state another node of a
  cluster made, indexed here;
* ``move(state, head)``: a kept state holds (or is about to hold) the messages whose chain is ``head``: indexed and
  recorded (before it exists upstream, so that a proxy killed meanwhile leaves no native session its records do not
  name);
* ``room(state)``: held while a kept state is created: room is made for it (``make_room``), one at a time, so that
  concurrent ones never pass ``limit()``;
* ``abandon(state)``: a kept state that could not be made or written, found no more and closed (or its record dropped);
* ``close(state)``: a kept state nobody holds closed (found no more; its conversation's next prompt is longer);
  ``close_copies_of(session)``: the states kept of a named session, closed with it;
* ``recorded()`` / ``forget(state)`` / ``trim()``: once the upstream first answers, the states an earlier life of
  this proxy recorded taken into the table (adopted by ``Sessions.check_upstream``), those gone forgotten, those
  beyond the bound closed.

Room is made from the least recently used idle state of the tenant holding the most, one a later turn extended
first (``state.evicted_first``). Every kept state is a ``SessionState`` whose name starts with ``KEPT_PREFIX``
(``SessionState.is_kept``): no client can name one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Iterator

from memt_core.client.errors import MemTClientError
from memt_core.errors import UnknownSession
from memt_proxy.errors import RateLimited
from memt_proxy.session.leases import Leases
from memt_proxy.session.prefix_index import Found, PrefixIndex
from memt_proxy.session.state import LIVE_SECONDS, SessionState, SessionTable, evicted_first
from memt_proxy.session.store import SessionRecordStore
from memt_proxy.session.upstream import Upstream

log = logging.getLogger("memt.proxy")


class KeptStates:
    """The kept states of ``table``, indexed by their ``prefixes`` and recorded in ``records``, within
    ``max_memory_states`` (see the module docstring); closed on ``upstream`` through ``leases``."""

    def __init__(self, upstream: Upstream, leases: Leases, records: SessionRecordStore, table: SessionTable, *, max_memory_states: int):
        self.upstream = upstream
        self.client = upstream.client
        self.leases = leases
        self.records = records
        self.table = table
        self.prefixes = PrefixIndex()  # read by the header-less plan; changed only here
        self.max_memory_states = max_memory_states  # kept states upstream at most
        self.making = asyncio.Lock()  # kept states are made one at a time (``room``)
        self._recorded = records.kept_states()  # taken into the table once the upstream answers (``recorded``)
        for recorded in self._recorded:
            self.prefixes.move(recorded["name"], recorded["head"])
        self.closed = 0  # kept states closed to make room (or beyond the bound), since start

    def limit(self) -> int:
        """Kept states at most: ``max_memory_states`` (sized from memory: ``state.states_within``). The upstream's own
        session capacity bounds them too: where it is full, making any session closes an idle state first
        (``Placement.offload_idle``)."""
        return self.max_memory_states

    def findable(self) -> int:
        """Kept states a resent transcript can resume (indexed)."""
        return len(self.prefixes)

    def reserve(self, link: str) -> bool:
        """Whether a new kept state may be made for the messages whose chain is ``link``: not in the table's last place
        (a request's, not a copy's), and none kept or being made for them already (concurrent identical requests make
        one); if so, reserved until ``made(link)``."""
        return self.table.room() >= 2 and self.prefixes.reserve(link)

    def made(self, link: str) -> None:
        """The state reserved for ``link`` made, or given up: requests waiting for it look again."""
        self.prefixes.made(link)

    def answered(self, link: str) -> None:
        """The transcript whose chain is ``link`` was answered: a request carrying it is worth keeping."""
        self.prefixes.answered(link)

    def found_elsewhere(self, links: list[str]) -> Found | None:
        """With records a cluster's proxies share: the deepest kept state another node made for the chain ``links``
        (its memory in the shared snapshot store), found here from then on; None without one (or shared records)."""
        if not self.records.shared:
            return None
        shared = self.records.kept_at(list(links))
        if shared is None:
            return None
        depth, name = shared
        self.prefixes.move(name, links[depth - 1])
        return Found(depth, name)

    def move(self, state: SessionState, head: str | None) -> None:
        """The kept state ``state`` now holds (or is about to hold) the messages whose chain is ``head``: index and record it."""
        self.prefixes.move(state.name, head)
        try:
            self.records.save_kept(state.native, state.tenant, state.name, head, state.origin)
        except OSError as exc:
            log.warning("could not record kept state %s: %s", state.native, exc)

    @contextlib.asynccontextmanager
    async def room(self, state: SessionState):
        """Hold while a kept state (``state``) is created: room is made for it, and kept states are made one at a time, so
        that concurrent ones never pass ``limit()``; RateLimited (the state is then not kept) where every kept state is
        in use."""
        async with self.making:
            if not await self.make_room(state):
                raise RateLimited(f"every kept conversation state ({self.limit()}) is in use", code="memory_states_full")
            yield

    async def make_room(self, keep: SessionState) -> bool:
        """Room for one more kept state (never closing ``keep``): while ``limit()`` or more are kept, close the least
        recently used idle one of the tenant holding the most (``keep``'s own counted), one a later turn extended before
        a conversation's latest (``evicted_first``): a tenant pushes out another's states only while it holds fewer, so
        none takes more than its share. False where the rest are busy or cannot be closed now."""
        failed: list[SessionState] = []
        while True:
            kept = [state for state in self.table if state.is_kept and state.exists and state is not keep]  # least recently used first
            if len(kept) < self.limit():
                return True
            held = Counter(state.tenant for state in kept)
            held[keep.tenant] += 1
            idle = [state for state in evicted_first(kept) if state.users == 0 and not state.lock.locked() and state not in failed]
            if not idle:
                return False
            most = max(held[state.tenant] for state in idle)
            victim = next(state for state in idle if held[state.tenant] == most)
            self.evicting(victim, f"{self.limit()} states kept: the most --memory-states-budget holds, or --max-memory-states")
            with victim.in_use():
                async with victim.lock:
                    if not await self.close(victim):
                        failed.append(victim)

    def evicting(self, state: SessionState, why: str) -> None:
        """Say so where a header-less conversation used within ``LIVE_SECONDS`` loses its latest state: its next turn is
        then read as text."""
        if state.is_kept and not state.extended and state.idle_since is not None and self.leases.clock.now() - state.idle_since < LIVE_SECONDS:
            log.warning("closing the latest state of a live header-less conversation (used %.0f s ago) to make room (%s): its next "
                        "turn is read as text", self.leases.clock.now() - state.idle_since, why)

    async def abandon(self, state: SessionState, lease: str | None = None) -> None:
        """A kept state that could not be made or written: found no more, and closed where it exists upstream (with
        ``lease``, if held), else its record dropped."""
        self.prefixes.drop(state.name)
        if state.exists:
            await self.close(state, lease)
        else:
            self.records.delete(state.native)

    async def close(self, state: SessionState, lease: str | None = None) -> bool:
        """Close a kept state nobody holds (its lease, or ``lease``, taken if need be): a closed state costs only a longer
        prompt when its conversation comes back (its messages are then sent again). False, and the state kept (found no
        more, but still counted), where it cannot be closed now: leased by another client (a proxy killed a moment ago,
        until its lease lapses), or the upstream away; its native session never outlives its record."""
        self.prefixes.drop(state.name)
        lease = state.drop_lease() or lease
        try:
            if lease is None:
                lease = await self.leases.one_shot(state)
            await self.client.control("close", state.native, lease=lease)
        except MemTClientError as exc:
            if not isinstance(exc.cause, UnknownSession):
                log.info("kept state %s not closed now: %s", state.native, exc.message)
                return False
        self.records.delete(state.native)
        state.forget()
        self.closed += 1
        return True

    async def close_copies_of(self, state: SessionState) -> None:
        """Close the states kept before a named session's turns (``NamedForks.keep_parent``), which hold copies of its
        memory, as the session is closed or its memory reset: what a client deletes is gone, not kept elsewhere."""
        for kept in [other for other in self.table if other.is_kept and other.exists and other.origin == state.native]:
            with kept.in_use():
                async with kept.lock:
                    await self.close(kept)

    def recorded(self) -> Iterator[SessionState]:
        """Once (the first time the upstream answers): each kept state an earlier life of this proxy recorded, taken into
        the table as it is yielded, for its caller to adopt (so that it counts against ``limit()`` and is closed to make
        room like any other) or ``forget``; those the table holds already are left out."""
        recorded, self._recorded = self._recorded, []
        for record in recorded:
            state = self.table.entry(record["tenant"], record["name"])
            if state.exists:
                continue
            state.origin = record.get("origin")
            yield state

    def forget(self, state: SessionState) -> None:
        """A recorded kept state closed upstream (or lost with it): nothing holds it, so it is neither found nor recorded."""
        self.prefixes.drop(state.name)
        self.records.delete(state.native)

    async def trim(self) -> None:
        """Close the kept states beyond ``limit()`` (after ``recorded``), so that a crash never leaves more states on the
        upstream than the bound; one whose lease is still held is closed to make room once it lapses."""
        kept = [state for state in self.table if state.is_kept and state.exists]
        for state in kept[: max(0, len(kept) - self.limit())]:
            async with state.lock:
                await self.close(state)
