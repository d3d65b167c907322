"""The proxy's session layer: per-session state over one memt_core upstream, for any OpenAI surface.

It is built of parts, each given what it uses (``memt_proxy.session``): ``state`` (what is known of a session
and the bounded table of them: no I/O), ``Upstream`` (calls to the upstream, its failures mapped to
``ProxyError`` once, its limits), ``Leases``, ``Writes`` (the memory-write sequence and its records),
``KeptStates`` (the states kept of conversations, indexed by ``memt_proxy.session.prefix_index``, within their
bound), ``Placement`` (create, adopt, offload, restore, unload), ``NamedForks`` (a named session's states kept before
a change) and ``HeldSession`` (one session held by one request). ``Sessions`` here builds them and adds the
per-request hold (``turn``), the commits behind answers and the admin actions.

Per (tenant, session name) the proxy keeps a ``SessionState``: the native session ID (derived from both,
so tenants never meet), a content hash of every message its memory holds, the upstream's published
version those hashes describe, a turn waiting for tool results, and a lock. Nothing here knows a chat
completion: a surface decides what to send and what a turn commits; this layer runs it on the session.

``SessionTable`` bounds the states (``--max-sessions``): making room drops the least recently used
*idle* state (no request holds or waits for it, so it holds no lease and no renewal task). Dropping a
state loses nothing upstream: the native session and its memory stay, and the next request on that
name adopts them again, reading the session's record from ``--state-directory`` (without one, the
history counts as unknown and a resent transcript is refused as edited, as after a proxy restart).
States without a native session are dropped first, so the proxy keeps sight of the native sessions it made.

Native sessions are bounded by the upstream's ``--max-sessions-per-rank`` (429 when full). When a new
native session is refused for that, the least recently used idle one is *offloaded* (``offload``): its
published memory exported to a content-addressed snapshot in the upstream's state directory (written
atomically there, its name the hash of its bytes, verified and checked against the model's identity on
import), the snapshot's name and the session's record kept by ``SessionRecordStore.save_offload``, and
the native session closed. Its next request restores it (create → import → publish) before anything
else, so the conversation goes on as if it had stayed. Without ``--state-directory`` the proxy keeps the
offload records in memory only (the newest ``MEMORY_OFFLOADS``): after a proxy restart, or past that
many, an offloaded session starts with empty memory and a resent transcript is committed again as
context, so only what memory held beyond the app's transcript is lost. An upstream without a state
directory cannot export: its idle sessions are then closed to make room, with the same loss.

Client-chosen snapshot names are tenant-scoped like session ids (``snapshot_file``): a name of one
tenant is another file upstream than the same name of another, so no tenant can read, overwrite or
probe another's snapshots; offload snapshots have names no client name maps to.

A request holds a session with ``turn(tenant, session)``::

    async with sessions.turn(tenant, session) as held:   # the session's lock (bounded wait → 409)
        ...                                               # decide from held.state; a refusal here creates nothing
        await held.start(with_answer=True)                # create or adopt, then the session's (kept) lease
                                                          # (create=True: both beside the answer, see below)
        body = await held.query(prompt, sampling)
        held.commit_turn_later(context_ids, turn_ids, committed)   # or: await held.commit_turn(...) now
    # lock released, or handed to the turn's commit; lease kept while the session is active

A session's lease outlives the request: it is kept (renewed every third of ``lease_ttl``) while the
session is active and released once the session has been idle for ``lease_idle`` seconds, when its
state is dropped from the table, or at shutdown (``aclose``); a leased session's turn then costs one
round trip before its answer, the query. A session whose memory is still empty (a new one's first turn) takes
its lease while its answer is generated (``start(with_answer=True)``), and a session the proxy knows nothing of
is created then too (``create=True``): an empty memory reads as none, so the answer is a plain generation's, the
same tokens a query would give; were the lease held by another client (which may have written meanwhile), or the
session found to hold memory already (``MemoryFound``: its prompt is prepared again), that generation is dropped
and the query made once the lease is ours.
A completed turn is committed *behind* the answer
(``held.commit_turn_later``): the request returns, and a task of the session's own writes the turn
(begin → commit → publish) still holding the session's lock, so the session's next request waits for
it (a wait that does not count against ``lease_wait``). A commit that fails leaves memory as it was:
the turn stays in the app's transcript and goes in with the next turn as context. ``aclose`` finishes
the commits still under way before it lets the leases go.

Every native failure is mapped to ``ProxyError`` here, once; an epoch mismatch means the upstream
restarted, which forgets every session (their native sessions are gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient, new_nonce
from memt_proxy.errors import Conflict, ProxyError
from memt_proxy.session.clock import Clock
from memt_proxy.session.forks import NamedForks
from memt_proxy.session.held import HeldSession
from memt_proxy.session.kept import KeptStates
from memt_proxy.session.leases import Leases
from memt_proxy.session.placement import Placement
from memt_proxy.session.state import (
    KEPT_PREFIX,
    LEASE_IDLE,
    LEASE_TTL,
    MAX_MEMORY_STATES,
    MAX_SESSIONS,
    SHUTDOWN_COMMIT_WAIT,
    Later,
    MemoryFound,
    MemoryTokens,
    PendingTurn,
    SessionState,
    SessionTable,
    native_session_id,
    new_kept_name,
    snapshot_file,
)
from memt_proxy.session.store import SessionRecordStore
from memt_proxy.session.upstream import Upstream
from memt_proxy.session.writes import Writes

__all__ = [
    "KEPT_PREFIX", "LEASE_IDLE", "MAX_MEMORY_STATES", "MAX_SESSIONS", "HeldSession", "MemoryFound", "PendingTurn", "SessionState",
    "SessionTable", "Sessions", "native_session_id", "snapshot_file",
]

log = logging.getLogger("memt.proxy")


class Sessions:
    """The sessions of one upstream: the table and its locks, held per request (``turn``), commits behind answers,
    and admin; the parts (``upstream``, ``leases``, ``writes``, ``kept``, ``placement``, ``forks``) do the rest."""

    def __init__(
        self,
        client: AsyncNativeClient,
        *,
        identity: str | None,
        served: dict | None = None,
        records: SessionRecordStore | None = None,
        max_sessions: int = MAX_SESSIONS,
        max_memory_states: int = MAX_MEMORY_STATES,
        lease_wait: float = 30.0,
        lease_ttl: int = LEASE_TTL,
        lease_idle: float = LEASE_IDLE,
        native_encoding: str | None = None,
        clock: Clock | None = None,
    ):
        self.records = records or SessionRecordStore(None)
        self.table = SessionTable(max_sessions)
        self.memory_tokens = MemoryTokens()  # the prompt tokens each session's memory spares, for every surface
        self.behind: set[asyncio.Task] = set()  # commits and forks under way behind their answers
        self.upstream = Upstream(client, identity=identity, served=served, table=self.table)
        self.clock = clock or Clock()  # the leases' time, and a state's idle time (``SessionState.idle_since``)
        self.leases = Leases(self.upstream, lease_wait=lease_wait, lease_ttl=lease_ttl, lease_idle=lease_idle, clock=self.clock)
        self.writes = Writes(self.upstream, self.leases, self.records, native_encoding=native_encoding)
        self.kept = KeptStates(self.upstream, self.leases, self.records, self.table, max_memory_states=max_memory_states)
        self.placement = Placement(self.upstream, self.leases, self.writes, self.records, self.table, self.kept)
        self.forks = NamedForks(self.upstream, self.writes, self.placement, self.kept, self.memory_tokens)

    async def check_upstream(self, *, refresh: bool = False) -> None:
        """The upstream serves this proxy's checkpoint (``Upstream.check``); the first time it answers, the kept states an
        earlier life of this proxy recorded are taken over (adopted upstream; those gone forgotten), then any beyond the
        bound closed (``KeptStates.trim``)."""
        await self.upstream.check(refresh=refresh)
        for state in self.kept.recorded():
            try:
                if await self.placement.adopt_existing(state) is None:  # closed upstream (or lost with it): nothing holds it
                    self.kept.forget(state)
            except MemTClientError:
                continue
        await self.kept.trim()

    def held(self, state: SessionState) -> HeldSession:
        """``state`` held by a request (without its lock: ``turn`` takes it)."""
        return HeldSession(state, self.upstream, self.leases, self.writes, self.placement, self.kept)

    async def aclose(self) -> None:
        """The proxy is shutting down: finish the commits under way (up to ``SHUTDOWN_COMMIT_WAIT``), release
        every kept lease, then close the upstream connections."""
        if self.behind:
            _, late = await asyncio.wait(set(self.behind), timeout=SHUTDOWN_COMMIT_WAIT)
            for task in late:  # its turn stays in the app's transcript: committed with the session's next turn
                log.warning("shutting down with a commit still under way; its turn will be committed with the next one")
                task.cancel()
        unreachable, kept = None, 0
        for state in [*self.table, *self.table.evicted]:
            lease = state.drop_lease()
            if lease is None or state.lock.locked():
                continue
            if unreachable is None:
                unreachable = await self.leases.release(state, lease, at_shutdown=True)
            kept += unreachable is not None  # the upstream is gone: the other leases are not tried
        if unreachable is not None:
            log.warning("shutting down: the upstream did not answer (%s); %d session lease(s) not released (they expire upstream within %d s)",
                        unreachable.message, kept, self.leases.lease_ttl)
        self.table.evicted.clear()
        await self.upstream.client.aclose()

    def state(self, tenant: str, session: str) -> SessionState:
        """The session's state (made if new); not held: callers outside ``turn`` only read it."""
        return self.table.entry(tenant, session)

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, session: str) -> AsyncIterator[HeldSession]:
        """Hold the session for one request: its lock now (after its previous turn's commit), its lease from
        ``start()``; on exit the lock goes to the turn's commit, if one was left to do, or is let go."""
        state = self.table.take(tenant, session)
        state.idle_since = None
        handed = False
        try:
            await self.release_evicted()
            if state.committing is not None:
                await asyncio.wait({state.committing})  # the session's own previous turn, not another request
            try:
                await asyncio.wait_for(state.lock.acquire(), timeout=self.leases.lease_wait)
            except asyncio.TimeoutError:
                raise Conflict(f"session busy: another request on this session is still running after {self.leases.lease_wait:.0f}s; retry later", code="session_busy") from None
            held = self.held(state)
            try:
                try:
                    yield held
                finally:
                    await held.settle()  # a query its client left is over upstream before the next request runs
                if held.later is not None:
                    self._commit_behind(state, held.later)
                    handed = True
            finally:
                if not handed:
                    state.lock.release()
        finally:
            self.table.give_back(state)
            self._rest(state)

    def _rest(self, state: SessionState) -> None:
        """A user let go of the state: once none is left, the keeper counts the session's idle time from now."""
        if state.users == 0 and state.idle_since is None:
            state.idle_since = self.clock.now()
            state.nudge.set()

    async def release_evicted(self) -> None:
        """Release the leases of states dropped from the table to make room; close dropped kept states."""
        while self.table.evicted:
            state = self.table.evicted.pop()
            if state.is_kept:
                await self.kept.close(state)
                continue
            lease = state.drop_lease()
            if lease is not None:
                await self.leases.release(state, lease)

    def _commit_behind(self, state: SessionState, later: Later) -> None:
        """Write a turn's commits in a task of the session's own, which holds the lock (taken over from the
        request) and a use of the state until the write ends, so its next request waits for it."""
        self.table.hold(state)
        task = asyncio.get_running_loop().create_task(self._write_behind(state, later))
        state.committing = task
        self.behind.add(task)
        task.add_done_callback(self.behind.discard)

    async def _write_behind(self, state: SessionState, later: Later) -> None:
        commits, committed = later.commits, later.committed
        try:
            try:
                if later.source is not None:
                    await self.rebuild(state, later.source)
                elif later.keep_parent:
                    await self.keep_parent(state)
                await self.writes.write(state, state.lease, commits, committed)
            except ProxyError as exc:
                # the app resends this turn in its transcript, and it is committed with the next one
                log.warning("committing a turn of %s failed (%s); it will be committed with the session's next turn", state.native, exc.message)
                await self.writes.settle(state, committed)
        except Exception:
            log.exception("committing a turn of %s failed", state.native)
        finally:
            state.committing = None
            state.lock.release()
            self.table.give_back(state)
            self._rest(state)

    async def keep_parent(self, state: SessionState) -> None:
        """Before a named session's memory changes (its lock and lease held): what it holds kept as a new state, held
        here while ``NamedForks.keep_parent`` makes it. Best effort: nothing is kept where it cannot be."""
        link = self.forks.parent_link(state)
        if link is None:
            return
        try:
            async with self.turn(state.tenant, new_kept_name()) as held:
                await self.forks.keep_parent(state, held.state, link)
        except ProxyError as exc:  # e.g. every session state of the proxy in use
            log.info("the state before a turn of %s is not kept (%s)", state.native, exc.message)
        finally:
            self.kept.made(link)

    async def rebuild(self, state: SessionState, source: str) -> None:
        """The named session (its lock held) made a copy of the kept state ``source``, held here meanwhile
        (``NamedForks.rebuild``); then its own lease."""
        async with self.turn(state.tenant, source) as held:
            await self.forks.rebuild(state, held.state)
        await self.placement.acquire(state)

    async def admin(self, tenant: str, session: str, action: str, **fields) -> dict:
        """inspect | save | restore | reset | close, under the session's lock (and lease, but for inspect).

        Every action needs a session that exists (upstream, or offloaded): an unknown one is a 404 and
        nothing is created. Snapshot names are the tenant's (``snapshot_file``); a save without a name
        gets a fresh one.
        """
        name = fields.get("name")
        if action == "save" and name is None:
            name = f"snapshot-{new_nonce()}.safetensors"
        file = snapshot_file(tenant, name) if name is not None else None
        await self.check_upstream()
        async with self.turn(tenant, session) as held:
            native = await held.find(session)
            if action == "inspect":
                return await held.inspect(session, native)
            await held.start()
            if action == "save":
                await held.save(file, overwrite=fields.get("overwrite", False), name=name)
                return {"snapshot": name}
            if action == "restore":
                await held.restore(file, name=name)
                return {"restored": name}
            if action == "reset":
                await self.writes.reset(held.state, held.lease)
                await self.kept.close_copies_of(held.state)
                return {"reset": True}
            if action == "close":
                await held.close()
                return {"closed": True}
            raise ValueError(action)
