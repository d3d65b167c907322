"""A named session's forks: the state its memory held kept before each change, so that a request diverging from
the change (a regenerate, an edit, an app's background task) resumes from it; and the session made a copy of the
kept state such a request was answered from, so that it follows that state."""

from __future__ import annotations

import logging
from typing import AsyncContextManager, Callable

from memt_proxy.errors import ProxyError, Unavailable
from memt_proxy.session.held import HeldSession
from memt_proxy.session.leases import Leases
from memt_proxy.session.placement import Placement
from memt_proxy.session.prefix_index import chain
from memt_proxy.session.state import MemoryTokens, SessionState, new_branch_name
from memt_proxy.session.upstream import Upstream
from memt_proxy.session.writes import Writes

log = logging.getLogger("memt.proxy")


class NamedForks:
    """Forks of named sessions, each state held with ``hold`` (``Sessions.turn``) and placed by ``placement``."""

    def __init__(
        self, hold: Callable[[str, str], AsyncContextManager[HeldSession]], upstream: Upstream, leases: Leases,
        writes: Writes, placement: Placement, memory_tokens: MemoryTokens,
    ):
        self.hold = hold
        self.upstream = upstream
        self.leases = leases
        self.writes = writes
        self.placement = placement
        self.records = placement.records
        self.memory_tokens = memory_tokens

    async def keep_parent(self, state: SessionState) -> None:
        """Before a named chat session's memory changes (its lock and lease held): what it holds kept as a state of its
        own, found by the chain of its messages (``memt_proxy.session.branches``), so that a request diverging from the change
        — a regenerate, an edit, an app's background task between turns — forks from it instead of starting over.
        Best effort: without room, or for a history the proxy does not know, nothing is kept."""
        if not (state.exists and state.committed and state.history_known and state.lease is not None):
            return
        link = chain(state.tenant, state.committed)[-1]
        if self.placement.table.room() < 2:
            return  # its place in the table would be the last one: a request's, not a copy's
        if not self.placement.prefixes.reserve(link):
            return  # kept already (the session forked from it, or a conversation without a header holds the same)
        try:
            async with self.hold(state.tenant, new_branch_name()) as held:
                parent = held.state
                parent.origin = state.native  # it holds that session's memory: closed with it
                parent.extended = True  # the session goes on past it: room is made from such states first
                self.placement.move_head(parent, link)  # recorded before it exists upstream (see ``branches._fork``)
                try:
                    async with self.placement.state_room(parent):
                        await self.placement.copy(parent, state, state.lease, make_room=False)  # never at a session's cost
                    self.memory_tokens.copied(parent, state)
                    self.writes.record(parent, self.records.save, parent.committed)
                except ProxyError as exc:
                    log.info("the state before a turn of %s is not kept (%s)", state.native, exc.message)
                    self.placement.prefixes.drop(parent.name)
                    if parent.exists:
                        await self.placement.close_branch(parent)
                    else:
                        self.records.delete(parent.native)
        except ProxyError as exc:
            log.info("the state before a turn of %s is not kept (%s)", state.native, exc.message)
        finally:
            self.placement.prefixes.made(link)

    async def rebuild(self, state: SessionState, source: str) -> None:
        """Make a named session's memory a copy of the kept state ``source`` (the session's lock held): a request that
        diverged from what the session held was answered from that state, and the session now follows it. A
        failure leaves the session to be adopted again (``settle``)."""
        async with self.hold(state.tenant, source) as held:
            origin = held.state
            if not (origin.exists and origin.history_known):
                raise Unavailable("the state the session forks from is gone", code="state_gone")
            lease = await self.leases.lease_of(origin)
            if state.exists:
                own = await self.leases.lease_of(state)
                state.drop_lease()
                await self.upstream.call(self.upstream.client.control, "close", state.native, lease=own)
            self.records.forget_offload(state.native)
            answered = state.last_turn  # the answer of the turn about to be written (its retry gets it again)
            state.forget()
            state.last_turn = answered
            await self.placement.copy(state, origin, lease)
            self.memory_tokens.copied(state, origin)
        await self.leases.acquire(state)
