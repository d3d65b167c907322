"""A named session's forks: the state its memory held kept before each change, so that a request diverging from
the change (a regenerate, an edit, an app's background task) resumes from it; and the session made a copy of the
kept state such a request was answered from, so that it follows that state."""

from __future__ import annotations

import logging

from memt_proxy.errors import ProxyError, Unavailable
from memt_proxy.session.kept import KeptStates
from memt_proxy.session.placement import Placement
from memt_proxy.session.prefix_index import chain
from memt_proxy.session.state import MemoryTokens, SessionState
from memt_proxy.session.upstream import Upstream
from memt_proxy.session.writes import Writes

log = logging.getLogger("memt.proxy")


class NamedForks:
    """Forks of named sessions, placed by ``placement`` and kept within their bound by ``kept``. It holds no session itself: ``Sessions`` holds the kept state
    it reads or makes (``Sessions.keep_parent``, ``Sessions.rebuild``) and hands it in."""

    def __init__(self, upstream: Upstream, writes: Writes, placement: Placement, kept: KeptStates, memory_tokens: MemoryTokens):
        self.upstream = upstream
        self.writes = writes
        self.placement = placement
        self.kept = kept
        self.records = placement.records
        self.memory_tokens = memory_tokens

    def parent_link(self, state: SessionState) -> str | None:
        """Before a named chat session's memory changes (its lock and lease held): the chain of the messages it holds,
        reserved for the state ``keep_parent`` makes of it (``KeptStates.made`` ends the reservation); None where
        nothing is kept: no room, a history the proxy does not know, or a state kept already for the same messages."""
        if not (state.exists and state.committed and state.history_known and state.lease is not None):
            return None
        link = chain(state.tenant, state.committed)[-1]
        # None where its place in the table would be the last one (a request's, not a copy's) or it is kept already (the
        # session forked from it, or a conversation without a header holds the same)
        return link if self.kept.reserve(link) else None

    async def keep_parent(self, state: SessionState, parent: SessionState, link: str) -> None:
        """What a named session holds kept as the new state ``parent`` (held), found by the chain of its messages,
        ``link`` (``parent_link``; ``memt_proxy.session.headerless``), so that a request diverging from the change — a
        regenerate, an edit, an app's background task between turns — forks from it instead of starting over. Best
        effort: where it cannot be made, nothing is kept."""
        parent.origin = state.native  # it holds that session's memory: closed with it
        parent.extended = True  # the session goes on past it: room is made from such states first
        self.kept.move(parent, link)  # recorded before it exists upstream (see ``headerless._fork``)
        try:
            async with self.kept.room(parent):
                await self.placement.copy(parent, state, state.lease, make_room=False)  # never at a session's cost
            self.memory_tokens.copied(parent, state)
            self.writes.record(parent, self.records.save, parent.committed)
        except ProxyError as exc:
            log.info("the state before a turn of %s is not kept (%s)", state.native, exc.message)
            await self.kept.abandon(parent)

    async def rebuild(self, state: SessionState, origin: SessionState) -> None:
        """Make a named session's memory a copy of the kept state ``origin`` (both held): a request that diverged from
        what the session held was answered from that state, and the session now follows it. A failure leaves the
        session to be adopted again (``settle``). The session's own lease is taken once ``origin`` is let go."""
        if not (origin.exists and origin.history_known):
            raise Unavailable("the state the session forks from is gone", code="state_gone")
        lease = await self.placement.lease_of(origin)
        if state.exists:
            own = await self.placement.lease_of(state)
            state.drop_lease()
            await self.upstream.call(self.upstream.client.control, "close", state.native, lease=own)
        self.records.forget_offload(state.native)
        answered = state.last_turn  # the answer of the turn about to be written (its retry gets it again)
        state.forget()
        state.last_turn = answered
        await self.placement.copy(state, origin, lease)
        self.memory_tokens.copied(state, origin)
