"""One session held by one request: its lease once started, its queries, its turn's commit and admin actions."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import AsyncIterator

from memt_core.client.errors import MemTClientError
from memt_core.client.native import new_nonce, new_transaction, query_rid
from memt_core.client.turns import MemoryWrite
from memt_core.errors import Conflict, LeaseConflict
from memt_proxy.errors import NotFound, ProxyError
from memt_proxy.session.kept import KeptStates
from memt_proxy.session.leases import Leases
from memt_proxy.session.placement import Placement
from memt_proxy.session.state import DEPARTED_WAIT, Later, LeaseTaken, MemoryFound, SessionState
from memt_proxy.session.upstream import Upstream
from memt_proxy.session.writes import Writes

log = logging.getLogger("memt.proxy")


class Start(enum.Enum):
    """What ``HeldSession.start`` left to the answer: nothing, the lease, or the native session and its lease."""

    DONE = "done"  # created or adopted, and leased (or not started yet)
    LEASE_WITH_ANSWER = "lease"  # an empty session's lease is taken while the answer is generated
    CREATE_WITH_ANSWER = "create"  # a session nothing is known of is created (or adopted) and leased then too


class HeldSession:
    """One session held by one request (see ``Sessions.turn``): its state, and its lease once started."""

    def __init__(self, state: SessionState, upstream: Upstream, leases: Leases, writes: Writes, placement: Placement, kept: KeptStates):
        self.state = state
        self.upstream = upstream
        self.client = upstream.client
        self.leases = leases
        self.writes = writes
        self.placement = placement
        self.kept_states = kept  # the states kept of it, closed with it
        self.records = placement.records
        self.lease: str | None = None
        self.later: Later | None = None  # a write left for after the request
        self.kept = False  # the lease was kept from an earlier request (it may have lapsed since)
        self.left = Start.DONE  # what ``start`` left to the answer
        self.running: str | None = None  # the RID of a streamed query not seen to its end (it may still run upstream)

    async def start(self, *, with_answer: bool = False, create: bool = False) -> None:
        """Create or adopt the native session, then take its lease: the one kept from an earlier request, or a new one.
        ``with_answer``: a new lease on a session whose memory is empty is taken by ``query`` while it generates;
        ``create`` as well: a session of which nothing is known or recorded is created (or adopted) by ``query`` too,
        which raises ``MemoryFound`` if it turns out to hold memory (e.g. after a restart without records)."""
        state = self.state
        if with_answer and create and not state.exists and state.blank and not self.records.known(state.native):
            self.left = Start.CREATE_WITH_ANSWER
            return
        await self.placement.ensure(state)
        self.kept = state.lease is not None
        if with_answer and not self.kept and state.empty:
            self.left = Start.LEASE_WITH_ANSWER
            return
        self.lease = await self.placement.lease_of(state)

    async def _leased(self) -> None:
        """Take the lease (and create the session) as ``start`` left to the answer, for a use that cannot overlap it."""
        left, self.left = self.left, Start.DONE
        if left is not Start.DONE:
            if left is Start.CREATE_WITH_ANSWER:
                await self.placement.ensure(self.state)
            self.lease = await self.placement.lease_of(self.state)

    async def _query_leasing(self, prompt: list[int], sampling: dict) -> dict:
        """``query`` on the empty memory of a session not yet leased (or not yet created): a plain generation (an
        empty memory reads as none: the same tokens) while the session is created and leased. If the session turns
        out to hold memory, or another client holds the lease (it may write before letting go), the generation is
        dropped and the query made under the lease once it is ours (after ``MemoryFound``, by the caller)."""
        left, self.left = self.left, Start.DONE
        state = self.state
        generation = asyncio.ensure_future(self.upstream.generate(prompt, sampling))
        try:
            if left is Start.CREATE_WITH_ANSWER:
                await self.placement.ensure(state)
                if not (state.blank and state.empty):
                    raise MemoryFound(state.native)
            self.lease = await self.placement.acquire(state, wait=False)
        except BaseException as exc:
            generation.cancel()
            await asyncio.gather(generation, return_exceptions=True)
            if not isinstance(exc, (LeaseTaken, MemoryFound)):
                raise
            self.lease = await self.placement.lease_of(state)
            if isinstance(exc, MemoryFound) and not state.blank:
                raise
            return await self.query(prompt, sampling)
        return await generation

    def _lapsed(self, exc: MemTClientError) -> bool:
        """Whether a query failed only because the lease kept from an earlier request lapsed (then it is retaken, once).
        A bare 409 (from a server that does not name the kind) may be that too."""
        if not (self.kept and (isinstance(exc.cause, LeaseConflict) or type(exc.cause) is Conflict)):
            return False
        self.kept = False
        return True

    async def _retake(self, exc: MemTClientError) -> None:
        """A new lease after ``_lapsed``; after a bare 409 the old lease may still hold, so it is released first."""
        old = self.lease
        if type(exc.cause) is Conflict and old is not None:
            await self.leases.release(self.state, old)
        self.lease = await self.placement.acquire(self.state)

    async def query(self, prompt: list[int], sampling: dict) -> dict:
        """Generate from ``prompt`` reading the session's memory."""
        if self.left is not Start.DONE:
            return await self._query_leasing(prompt, sampling)
        try:
            return await self.client.query(self.state.native, self.lease, prompt, sampling_params=sampling)
        except MemTClientError as exc:
            if not self._lapsed(exc):
                raise self.upstream.error(exc) from None
            lapsed = exc
        await self._retake(lapsed)
        return await self.upstream.call(self.client.query, self.state.native, self.lease, prompt, sampling_params=sampling)

    async def query_stream(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        """``query`` as cumulative stream bodies; closing the iterator early cancels the upstream query."""
        if self.left is Start.LEASE_WITH_ANSWER:
            async for body in self._query_stream_leasing(prompt, sampling):
                yield body
            return
        await self._leased()
        nonce = new_nonce()
        upstream = self.client.query_stream(self.state.native, self.lease, prompt, sampling_params=sampling, nonce=nonce)
        self.running = query_rid(self.state.native, nonce)  # until its end is read: ``settle`` cancels it otherwise
        try:
            first = await upstream.__anext__()
        except StopAsyncIteration:
            self.running = None
            return
        except MemTClientError as exc:
            await upstream.aclose()
            if not self._lapsed(exc):
                raise self.upstream.error(exc) from None
            await self._retake(exc)
            async for body in self.upstream.stream(self.client.query_stream(self.state.native, self.lease, prompt, sampling_params=sampling)):
                yield body
            return
        except BaseException:
            await upstream.aclose()
            raise
        yield first
        async for body in self.upstream.stream(upstream):
            yield body
        self.running = None

    async def settle(self) -> None:
        """Before the session is let go: a streamed query left before its end (the client went away, a stop string
        ended the answer) may still run upstream, where it would refuse the session's next request (409, "a request in
        flight"). Cancel it, then wait until it has ended upstream (up to ``DEPARTED_WAIT``)."""
        rid, self.running = self.running, None
        if rid is None or self.lease is None:
            return
        native = self.state.native
        try:
            await self.client.control("cancel", native, lease=self.lease, request_id=rid)
        except MemTClientError:
            pass  # ended already, or the lease lapsed: inspect tells
        deadline = time.monotonic() + DEPARTED_WAIT
        while True:
            try:
                in_flight = (await self.client.control("inspect", native)).get("in_flight") or []
            except MemTClientError:
                return  # gone (an upstream restart, a close): nothing runs on it
            if rid not in in_flight:
                return
            if time.monotonic() > deadline:
                log.warning("a cancelled query of %s was still running upstream after %.0f s", native, DEPARTED_WAIT)
                return
            await asyncio.sleep(0.02)

    async def _query_stream_leasing(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        """``query_stream`` as ``_query_leasing`` makes ``query``: a plain generation's stream, started while the lease
        is taken and passed on only once the lease is ours; were it another client's, dropped for a query under it."""
        self.left = Start.DONE
        upstream = self.upstream.generate_stream(prompt, sampling)
        first = asyncio.ensure_future(anext(upstream, None))
        try:
            try:
                self.lease = await self.placement.acquire(self.state, wait=False)
            except LeaseTaken:
                taken = True
            else:
                taken = False
                body = await first
                while body is not None:
                    yield body
                    body = await anext(upstream, None)
        finally:
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await upstream.aclose()
        if taken:
            self.lease = await self.placement.lease_of(self.state)
            async for body in self.query_stream(prompt, sampling):
                yield body

    async def commit_turn(self, context_ids: list[int], turn_ids: list[int], committed: list[str]) -> None:
        """Write a completed turn (after the uncommitted context before it) into memory, which then holds ``committed``."""
        commits = self._commits(context_ids, turn_ids)
        await self._leased()
        try:
            await self.writes.write(self.state, self.lease, commits, committed)
        except ProxyError:
            await self.writes.settle(self.state, committed)
            self.lease = None
            raise

    def commit_turn_later(self, context_ids: list[int], turn_ids: list[int], committed: list[str], *, keep_parent: bool = False, source: str | None = None) -> None:
        """``commit_turn``, done once the request lets the session go (its answer is out by then); the session's
        next request waits for it. If it fails, memory stays as it was (see the module docstring). ``keep_parent``
        and ``source``: see ``Later``."""
        self.later = Later(self._commits(context_ids, turn_ids), committed, keep_parent, source)

    def _commits(self, context_ids: list[int], turn_ids: list[int]) -> list[list[int]]:
        """A turn's commits: the uncommitted context before it (if any), then the turn in pieces the upstream takes."""
        return ([context_ids] if context_ids else []) + self.upstream.pieces(turn_ids)

    async def find(self, session: str) -> dict | None:
        """Adopt the session if it exists upstream; bring it back if its memory is kept elsewhere — offloaded by
        this proxy, unloaded by an upstream with a snapshot store (idle, or a drained node's), or served by
        another node of a cluster (shared records); 404 if none of these (nothing is created). Returns the
        upstream's inspect of a session it held, None for one brought back."""
        state = self.state
        # e.g. the upstream unreachable: its error, not a 404
        native = await self.upstream.call(self.placement.adopt_existing, state, adopt=not state.exists)
        if native is not None:
            return native
        if state.exists:
            await self.placement.reload(state)  # let go upstream (its memory is in the store): bring it back
        elif self.records.load_offload(state.native) is not None or self.records.recorded_elsewhere(state.native):
            await self.placement.ensure(state)
        else:
            raise NotFound(f"session {session!r} does not exist", code="session_not_found")
        return None

    async def inspect(self, session: str, native: dict | None = None) -> dict:
        """The session as the proxy and the upstream see it (``find`` first; ``native``: the upstream's inspect
        ``find`` returned, so it is not asked twice)."""
        state = self.state
        if native is None:
            native = await self.upstream.call(self.client.control, "inspect", state.native)
        return {"session": session, "native": native, "committed_messages": len(state.committed), "history_known": state.history_known, "pending_tool_calls": state.pending is not None}

    async def save(self, file: str, *, overwrite: bool = False, name: str) -> None:
        """Export the published memory as the upstream snapshot ``file`` (the client calls it ``name``)."""
        await self._leased()
        try:
            await self.client.control("export", self.state.native, lease=self.lease, encoding=self.writes.native_encoding, file=file, overwrite=overwrite)
        except MemTClientError as exc:
            raise _renamed(self.upstream.error(exc), file, name) from None

    async def restore(self, file: str, *, name: str) -> None:
        """Replace memory with the snapshot ``file`` (begin → import → publish): it then holds no transcript message the proxy knows."""
        write = MemoryWrite(new_transaction(), new_nonce=new_nonce, import_file=file, memory_read=True, abort_on_failure=True)
        await self._leased()
        try:
            await self.writes.drive(write, self.state, self.lease, [])
        except ProxyError as exc:
            raise _renamed(exc, file, name) from None

    async def close(self) -> None:
        """Delete the native session (the lease goes with it) and its record."""
        state = self.state
        await self._leased()
        state.drop_lease()  # the renewal task ends before the session does
        await self.upstream.call(self.client.control, "close", state.native, lease=self.lease)
        self.lease = None
        self.records.delete(state.native)
        self.records.forget_offload(state.native)
        state.forget()
        await self.kept_states.close_copies_of(state)


def _renamed(error: ProxyError, file: str, name: str) -> ProxyError:
    """``error`` with the upstream's file name replaced by the client's own name for it."""
    error.message = error.message.replace(file, name)
    return error
