"""The proxy's session layer: per-session state over one memt_core upstream, for any OpenAI surface.

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
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Iterator

from memt_core.client.chat_format import serves
from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient, new_nonce, new_transaction
from memt_core.client.turns import AbortStep, BeginStep, CommitStep, ImportStep, MemoryWrite, PublishStep, Step, WaitStep
from memt_core.errors import Conflict, EpochMismatch, InvalidRequest, LeaseConflict, SessionBusy, SessionExists, UnknownSession
from memt_core.names import check_snapshot_name
from memt_proxy.errors import ProxyError, from_native
from memt_proxy.prefix_index import PrefixIndex
from memt_proxy.store import SessionRecordStore

log = logging.getLogger("memt.proxy")

MAX_SESSIONS = 1024  # default --max-sessions: session states kept in memory
MAX_MEMORY_STATES = 256  # default --max-memory-states: header-less branches kept as native sessions
LEASE_TTL = 30  # default native lease lifetime (seconds); renewed while the session is active
LEASE_IDLE = 30.0  # default seconds a session's lease is kept after its last request
SHUTDOWN_COMMIT_WAIT = 30.0  # seconds aclose() gives the commits still under way
COMMIT_CAPACITY_WAIT = 30.0  # seconds a commit retries while the upstream's in-flight commit capacity is full (429)
RELEASE_WAIT = 10.0  # seconds a release retries while a cancelled query is still winding down upstream
#: sessions offloaded, at most, to make room for one new native session: requests creating sessions at the
#: same time may each take the slot another one freed, so one request may need several
OFFLOAD_TRIES = 16
SNAPSHOT_NAME_LIMIT = 207  # the native snapshot-name grammar's longest name
BRANCH_PREFIX = "~"  # header-less branches' session names start with it: no X-MemT-Session can


def native_session_id(tenant: str, session: str) -> str:
    """Tenant-scoped, collision-resistant native session ID within the native grammar."""
    return "p-" + hashlib.sha256(f"{tenant}\x00{session}".encode()).hexdigest()[:40]


def snapshot_file(tenant: str, name: str) -> str:
    """The upstream file of a tenant's snapshot ``name``: ``t<hash of tenant>-<name>``, so names never meet across tenants."""
    try:
        check_snapshot_name(name)
    except InvalidRequest as exc:
        raise ProxyError(400, exc.message, param="name", code="invalid_snapshot_name") from None
    file = f"t{hashlib.sha256(tenant.encode()).hexdigest()[:16]}-{name}"
    if len(file) > SNAPSHOT_NAME_LIMIT:
        raise ProxyError(400, f"snapshot names are at most {SNAPSHOT_NAME_LIMIT - len(file) + len(name)} characters here", param="name", code="invalid_snapshot_name")
    return file


@dataclass
class PendingTurn:
    """A turn waiting for tool results: the hashes of its messages so far and its exact token ids."""

    hashes: list[str]
    ids: list[int]
    thinking: bool


@dataclass
class SessionState:
    """What the proxy knows of one session; read and changed only by the holder of ``lock``."""

    native: str
    tenant: str = ""
    name: str = ""  # the session's name: a client's X-MemT-Session, or a header-less branch's (``memt_proxy.branches``)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    committed: list[str] = field(default_factory=list)  # hashes of committed messages, in order
    history_known: bool = True  # False when we adopted a native session whose history we never saw
    pending: PendingTurn | None = None
    exists: bool = False
    version: int = 0  # the upstream's published_version of the memory that ``committed`` describes
    lease: str | None = None  # the native lease, kept across requests while the session is active
    keeper: asyncio.Task | None = None  # renews the lease, and releases it once the session is idle
    idle_since: float | None = None  # monotonic time the last user let go (None: in use)
    nudge: asyncio.Event = field(default_factory=asyncio.Event)  # wakes the keeper when the session goes idle
    committing: asyncio.Task | None = None  # the commit of the previous turn, while under way
    users: int = 0  # requests holding or waiting for this state, and its commit: while any, it is never dropped
    last_turn: object = None  # the surface's answer to the last committed turn, for an identical retry

    @property
    def branch(self) -> bool:
        """A header-less conversation's state (its name is the proxy's, outside the client's grammar)."""
        return self.name.startswith(BRANCH_PREFIX)

    @property
    def empty(self) -> bool:
        """The native session's memory is the empty one it was created with (never published to)."""
        return self.exists and self.version == 0

    @property
    def blank(self) -> bool:
        """Nothing is known to be in memory and no turn waits for tool results: what a prompt prepared
        before the native session was created or adopted assumed."""
        return not self.committed and self.history_known and self.pending is None

    def forget(self) -> None:
        """The native session is gone (closed, or the upstream restarted): start over on next use."""
        self.exists, self.version, self.committed, self.pending, self.history_known = False, 0, [], None, True
        self.last_turn = None
        self.drop_lease()

    def drop_lease(self) -> str | None:
        """Stop renewing the lease and forget it (no I/O); returns it, for a release upstream."""
        lease, self.lease = self.lease, None
        if self.keeper is not None:
            self.keeper.cancel()
            self.keeper = None
        return lease


class SessionTable:
    """At most ``capacity`` session states; making room drops the least recently used idle one.

    No I/O and no clock: "recently used" is the order of ``take`` calls. A state in use (``users`` > 0)
    is never dropped; when every state is in use a new session is refused with 429 rather than let
    the table grow.
    """

    def __init__(self, capacity: int = MAX_SESSIONS):
        if capacity < 1:
            raise ValueError("the session table needs room for at least one session")
        self.capacity = capacity
        self._states: OrderedDict[tuple[str, str], SessionState] = OrderedDict()
        self.dropped = 0  # states dropped to make room, since start
        self.evicted: list[SessionState] = []  # dropped states whose lease is still to be released

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[SessionState]:
        return iter(list(self._states.values()))

    def get(self, tenant: str, session: str) -> SessionState | None:
        return self._states.get((tenant, session))

    def entry(self, tenant: str, session: str) -> SessionState:
        """The session's state, made (room permitting) if new, and now the most recently used."""
        key = (tenant, session)
        state = self._states.get(key)
        if state is None:
            self._make_room()
            state = self._states[key] = SessionState(native=native_session_id(tenant, session), tenant=tenant, name=session)
        self._states.move_to_end(key)
        return state

    def take(self, tenant: str, session: str) -> SessionState:
        """``entry``, marked in use until ``give_back``."""
        state = self.entry(tenant, session)
        state.users += 1
        return state

    def give_back(self, state: SessionState) -> None:
        state.users -= 1

    def _make_room(self) -> None:
        if len(self._states) < self.capacity:
            return
        idle = [key for key, state in self._states.items() if state.users == 0]  # least recently used first
        # a state without a native session first: the proxy keeps sight of the native sessions it may offload
        for key in sorted(idle, key=lambda key: self._states[key].exists):
            state = self._states.pop(key)
            self.dropped += 1
            if state.lease is not None or state.branch and state.exists:  # a branch's native session is closed with it
                self.evicted.append(state)
            return
        raise ProxyError(
            429, f"the proxy is serving {self.capacity} sessions at once (--max-sessions); retry when one finishes",
            code="too_many_sessions",
        )


class LeaseTaken(Exception):
    """Another client holds the session's lease (``Sessions.acquire(wait=False)``); handled here, never answered."""


class MemoryFound(Exception):
    """``HeldSession.query``, creating a session beside its answer, adopted one that holds memory: the prompt,
    prepared for an empty one, must be prepared again (the lease is taken by then); never answered."""


class Sessions:
    """The sessions of one upstream: table, locks, leases, records, the memory-write sequence, admin."""

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
    ):
        self.client = client
        self.identity = identity  # the model/tokenizer identity the upstream must serve
        self.served = served  # what its /memt/identity must say (model, config_sha256) when it reports no identity hash
        self.records = records or SessionRecordStore(None)
        self.table = SessionTable(max_sessions)
        self.max_memory_states = max_memory_states  # header-less branches kept upstream at most
        self.lease_wait = lease_wait
        self.lease_ttl = lease_ttl
        self.lease_idle = lease_idle  # seconds an idle session keeps its lease (0: released after each request)
        self.behind: set[asyncio.Task] = set()  # commits under way behind their answers
        self.native_encoding = native_encoding  # snapshot encoding of save/restore
        self.max_prefill_tokens: int | None = None
        self.chunk_tokens: int | None = None
        self._upstream_checked = False
        self.offloads = 0  # native sessions offloaded to make room, since start
        self.restores = 0  # offloaded sessions restored, since start
        self.writes = 0  # memory writes published, since start
        self.prefixes = PrefixIndex()  # header-less branches' heads (``memt_proxy.branches``), as recorded
        for branch in self.records.branches():
            self.prefixes.move(branch["name"], branch["head"])
        self.branches_closed = 0  # header-less branches closed to make room, since start

    # ------------------------------------------------------------------ upstream

    async def check_upstream(self, *, refresh: bool = False) -> None:
        """The upstream must serve the checkpoint this proxy encodes prompts for; learn its limits.
        ``refresh``: ask it again even if it answered before (readiness)."""
        if self._upstream_checked and not refresh:
            return
        try:
            capabilities = await self.client.capabilities(refresh=True)
        except MemTClientError as exc:
            raise from_native(exc) from None
        described = None
        if "identity" not in capabilities:  # a server that reports only the spec's fields: its /memt/identity
            try:
                described = await self.client.identity()
            except MemTClientError as exc:
                raise from_native(exc) from None
        if not serves(self.identity, self.served, capabilities, described):
            raise ProxyError(503, "the upstream MemT server serves a different model/tokenizer than this proxy's --model-path", code="upstream_identity_mismatch")
        self.max_prefill_tokens = capabilities.get("max_prefill_tokens")
        self.chunk_tokens = capabilities.get("chunk_tokens")
        self._upstream_checked = True

    async def call(self, call, *args, **kwargs):
        """``await call(*args, **kwargs)`` on the native client, its failure mapped to ProxyError."""
        try:
            return await call(*args, **kwargs)
        except MemTClientError as exc:
            raise self.upstream_error(exc) from None

    async def stream(self, upstream: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """A native stream's bodies, its failure mapped to ProxyError; leaving early closes it (cancels upstream)."""
        try:
            async for body in upstream:
                yield body
        except MemTClientError as exc:
            raise self.upstream_error(exc) from None
        finally:
            await upstream.aclose()

    async def aclose(self) -> None:
        """The proxy is shutting down: finish the commits under way (up to ``SHUTDOWN_COMMIT_WAIT``), release
        every kept lease, then close the upstream connections."""
        if self.behind:
            _, late = await asyncio.wait(set(self.behind), timeout=SHUTDOWN_COMMIT_WAIT)
            for task in late:  # its turn stays in the app's transcript: committed with the session's next turn
                log.warning("shutting down with a commit still under way; its turn will be committed with the next one")
                task.cancel()
        for state in [*self.table, *self.table.evicted]:
            lease = state.drop_lease()
            if lease is not None and not state.lock.locked():
                await self.release(state, lease)
        self.table.evicted.clear()
        await self.client.aclose()

    def upstream_error(self, exc: MemTClientError) -> ProxyError:
        """The ProxyError for a native failure; an epoch mismatch means the upstream restarted."""
        if isinstance(exc.cause, EpochMismatch):
            self._upstream_checked = False  # the upstream restarted: sessions are gone; relearn its epoch
            for state in self.table:
                state.forget()
        return from_native(exc)

    def generate(self, prompt: list[int], sampling: dict):
        """An ordinary generation without memory (no session)."""
        return self.call(self.client.generate, prompt, sampling_params=sampling)

    def generate_stream(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        return self.stream(self.client.generate_stream(prompt, sampling_params=sampling))

    # ------------------------------------------------------------------ holding a session

    def state(self, tenant: str, session: str) -> SessionState:
        """The session's state (made if new); not held: callers outside ``turn`` only read it."""
        return self.table.entry(tenant, session)

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, session: str) -> AsyncIterator["HeldSession"]:
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
                await asyncio.wait_for(state.lock.acquire(), timeout=self.lease_wait)
            except asyncio.TimeoutError:
                raise ProxyError(409, f"session busy: another request on this session is still running after {self.lease_wait:.0f}s; retry later", code="session_busy") from None
            held = HeldSession(self, state)
            try:
                yield held
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
            state.idle_since = time.monotonic()
            state.nudge.set()

    async def release_evicted(self) -> None:
        """Release the leases of states dropped from the table to make room; close dropped branches."""
        while self.table.evicted:
            state = self.table.evicted.pop()
            if state.branch:
                await self.close_branch(state)
                continue
            lease = state.drop_lease()
            if lease is not None:
                await self.release(state, lease)

    def move_head(self, state: SessionState, head: str | None) -> None:
        """A header-less branch now holds (or is about to hold) the state named ``head``: index and record it."""
        self.prefixes.move(state.name, head)
        try:
            self.records.save_branch(state.native, state.tenant, state.name, head)
        except OSError:
            log.warning("could not record branch %s", state.native, exc_info=True)

    async def make_branch_room(self, keep: SessionState) -> None:
        """Close the least recently used idle header-less branches (never ``keep``) while ``max_memory_states``
        or more are kept, so a new one fits; busy ones are passed over (the bound then waits for them)."""
        branches = [state for state in self.table if state.branch and state.exists and state is not keep]
        for state in branches[: max(0, len(branches) + 1 - self.max_memory_states)]:
            if state.users == 0 and not state.lock.locked():
                state.users += 1
                try:
                    async with state.lock:
                        await self.close_branch(state)
                finally:
                    state.users -= 1

    async def close_branch(self, state: SessionState, lease: str | None = None) -> None:
        """Close a header-less branch nobody holds (its lease, or ``lease``, taken if need be): a dropped branch
        costs only a longer prompt when its conversation comes back (its messages are then sent again)."""
        self.prefixes.drop(state.name)
        lease = state.drop_lease() or lease
        try:
            if lease is None:
                lease = (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]
            await self.client.control("close", state.native, lease=lease)
        except MemTClientError as exc:
            log.info("closing branch %s: %s", state.native, exc.message)
        self.records.delete(state.native)
        state.forget()
        self.branches_closed += 1

    def _commit_behind(self, state: SessionState, commits: tuple[list[list[int]], list[str]]) -> None:
        """Write a turn's commits in a task of the session's own, which holds the lock (taken over from the
        request) and a use of the state until the write ends, so its next request waits for it."""
        state.users += 1
        task = asyncio.get_running_loop().create_task(self._write_behind(state, *commits))
        state.committing = task
        self.behind.add(task)
        task.add_done_callback(self.behind.discard)

    async def _write_behind(self, state: SessionState, commits: list[list[int]], committed: list[str]) -> None:
        try:
            try:
                await self.write(state, state.lease, commits, committed)
            except ProxyError as exc:
                # the app resends this turn in its transcript, and it is committed with the next one
                log.warning("committing a turn of %s failed (%s); it will be committed with the session's next turn", state.native, exc.message)
                await self.settle(state, committed)
        except Exception:
            log.exception("committing a turn of %s failed", state.native)
        finally:
            state.committing = None
            state.lock.release()
            self.table.give_back(state)
            self._rest(state)

    async def settle(self, state: SessionState, committed: list[str]) -> None:
        """After a failed write: release the lease (abandoning a transaction left open), then learn from the
        upstream whether the write was published after all (memory holds ``committed``) or not (as it was);
        if neither, the session is adopted again on its next request."""
        lease = state.drop_lease()
        if lease is not None:
            await self.release(state, lease)
        try:
            version = (await self.client.control("inspect", state.native))["published_version"]
        except MemTClientError:
            version = None
        if version == state.version + 1:
            self.changed(state, committed)
        elif version != state.version:
            state.exists = False

    async def ensure(self, state: SessionState) -> None:
        """Create the native session, or adopt it if it exists already (e.g. made by an earlier proxy),
        or restore it if it was offloaded."""
        if state.exists:
            return
        offloaded = self.records.load_offload(state.native)
        if not await self._create(state):
            self.adopt(state, await self.call(self.client.control, "inspect", state.native))
            return
        if offloaded is not None:
            await self._restore(state, offloaded)
            return
        self.records.delete(state.native)  # a record from an earlier life of this id (before an upstream restart)
        state.exists, state.version, state.committed, state.history_known = True, 0, [], True

    async def _create(self, state: SessionState) -> bool:
        """Create the native session (True), or find it exists (False: made earlier, or restored from the
        upstream's snapshot store, so adopted at its version); when the upstream is full, offload
        idle sessions to make room (up to ``OFFLOAD_TRIES``) before passing its 429 on."""
        for attempt in range(OFFLOAD_TRIES + 1):
            try:
                created = await self.client.control("create", state.native, memory_read=True)
                # a core with a snapshot store restored it (after a crash, or from another node): it is not new
                return not created.get("restored_version")
            except MemTClientError as exc:
                # errors rebuilt from the wire carry the generic class of their status (Conflict), not SessionExists
                if isinstance(exc.cause, SessionExists):
                    return False
                if getattr(exc, "status", None) != 429 or attempt == OFFLOAD_TRIES or not await self.offload_idle(state):
                    raise self.upstream_error(exc) from None
        raise AssertionError("unreachable")

    async def offload_idle(self, keep: SessionState) -> bool:
        """Offload the least recently used idle session with a native session (never ``keep``); False if none could be."""
        for state in self.table:  # least recently used first
            if state is not keep and state.exists and state.users == 0 and not state.lock.locked():
                if await self.offload(state):
                    return True
        return False

    async def offload(self, state: SessionState) -> bool:
        """Export an idle session's published memory, record where, and close its native session (see the
        module docstring); False, changing nothing, if it is busy or the upstream refuses."""
        if state.users or state.lock.locked() or not state.exists:
            return False
        state.users += 1
        await state.lock.acquire()  # free: taken at once
        try:
            try:
                lease = state.drop_lease() or (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]
            except MemTClientError:
                return False  # leased by another client, or gone: not ours to offload now
            if state.branch:
                await self.close_branch(state, lease)
                return True
            try:
                exported = await self.client.control("export", state.native, lease=lease, encoding=self.native_encoding)
                file = exported["file"]
            except MemTClientError as exc:
                if getattr(exc, "status", None) != 400:
                    await self.client.control("release", state.native, lease=lease)
                    return False
                file = None  # the upstream cannot export (no state directory): close it all the same, losing its memory
                log.warning("offloading %s without a snapshot: the upstream cannot export (%s); its memory is lost", state.native, exc.message)
            if file is not None:
                pending = asdict(state.pending) if state.pending is not None else None
                self.records.save_offload(state.native, file, state.committed if state.history_known else None, pending)
            await self.client.control("close", state.native, lease=lease)
            if file is None:
                self.records.delete(state.native)
                state.forget()
            else:
                state.exists, state.version = False, 0
            self.offloads += 1
            return True
        except MemTClientError as exc:
            log.warning("offloading %s failed: %s", state.native, exc.message)
            return False
        finally:
            state.lock.release()
            state.users -= 1

    async def _restore(self, state: SessionState, offloaded: dict) -> None:
        """Load an offloaded session's snapshot into its new native session (begin → import → publish)."""
        state.exists, state.version = True, 0
        state.committed, state.history_known = offloaded["committed"] or [], offloaded["committed"] is not None
        lease = await self.lease_of(state)  # kept for the request that brought the session back
        try:
            write = MemoryWrite(new_transaction(), new_nonce=new_nonce, import_file=offloaded["file"], memory_read=True, abort_on_failure=True)
            await self.drive(write, state, lease, state.committed)
            state.history_known = offloaded["committed"] is not None
        except ProxyError as exc:
            # the snapshot is gone or damaged: the session goes on with empty memory, rebuilt from resent transcripts
            log.warning("restoring offloaded %s from %s failed (%s); it starts with empty memory", state.native, offloaded["file"], exc.message)
            state.version, state.committed, state.history_known = 0, [], True
        self.records.forget_offload(state.native)
        if offloaded.get("pending") is not None and state.committed == (offloaded["committed"] or []):
            self.set_pending(state, PendingTurn(**offloaded["pending"]))
        self.restores += 1

    def adopt(self, state: SessionState, native: dict) -> None:
        """Take over a native session that exists upstream: its record, if one matches its version, says
        what memory holds and which turn, if any, waits for tool results."""
        version = native["published_version"]
        committed = self.records.load(state.native, version)
        if committed is None and version == 0:
            committed = []  # never published to: its memory is empty (e.g. a proxy died before its first commit)
        state.exists, state.version = True, version
        state.committed, state.history_known = committed or [], committed is not None
        pending = self.records.load_pending(state.native, version) if committed is not None else None
        state.pending = PendingTurn(**pending) if pending is not None else None

    async def lease_of(self, state: SessionState) -> str:
        """The session's kept lease, or a new one (kept from now on); the caller holds the lock."""
        if state.lease is None:
            await self.acquire(state)
        return state.lease

    async def acquire(self, state: SessionState, *, wait: bool = True) -> str:
        """A new native lease (waiting up to ``lease_wait`` while another client holds it; ``wait=False``: raising
        ``LeaseTaken`` at once), kept as the session's and renewed until released, or until the session has been idle
        for ``lease_idle`` seconds. A session the upstream no longer holds (a server with a snapshot store unloads idle
        ones) is brought back first."""
        state.drop_lease()
        deadline = time.monotonic() + self.lease_wait
        reloaded = False
        while True:
            try:
                lease = (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]
                break
            except MemTClientError as exc:
                if isinstance(exc.cause, UnknownSession) and state.exists and not reloaded:
                    reloaded = True
                    await self._reload(state)
                    continue
                if isinstance(exc.cause, LeaseConflict) and not wait:
                    raise LeaseTaken(exc.message) from None
                if not isinstance(exc.cause, LeaseConflict) or time.monotonic() > deadline:
                    raise self.upstream_error(exc) from None
            await asyncio.sleep(0.2)
        state.lease = lease
        state.keeper = asyncio.get_running_loop().create_task(self._keep(state, lease))
        return lease

    async def _reload(self, state: SessionState) -> None:
        """Create the session again upstream, where its durable memory is restored, and adopt it; what this
        proxy knew of its memory stays when the version is the one it knew."""
        version, committed, known, pending = state.version, state.committed, state.history_known, state.pending
        state.exists = False
        await self.ensure(state)
        if state.version == version and not state.history_known:
            state.committed, state.history_known, state.pending = committed, known, pending
        log.info("%s was no longer held upstream: restored at version %d", state.native, state.version)

    async def unload(self, state: SessionState) -> bool:
        """Hand the session off: the upstream frees it and gives up its ownership, keeping its memory in the
        snapshot store, so that the server a router sends it to next takes it over (``POST /admin/drain``).
        False (and only the lease released) where the upstream cannot: no snapshot store, or not this server."""
        lease = state.drop_lease()
        if lease is None:
            try:
                lease = (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]
            except MemTClientError as exc:
                if isinstance(exc.cause, UnknownSession):
                    state.exists = False  # its upstream let it go already (idle): nothing left to hand off
                    return True
                log.info("%s not unloaded (%s)", state.native, exc.message)
                return False
        try:
            await self.client.control("unload", state.native, lease=lease)
        except MemTClientError as exc:
            log.info("%s not unloaded (%s); its lease is released", state.native, exc.message)
            await self.release(state, lease)
            return False
        state.exists = False  # a later request here restores it (``_reload`` through ``ensure``)
        return True

    async def _keep(self, state: SessionState, lease: str) -> None:
        """Renew the lease every third of its lifetime while the session is in use or was used within
        ``lease_idle`` seconds, then release it: long generations and active conversations keep it, and a
        proxy that dies leaves its sessions leased for at most ``lease_ttl`` seconds."""
        renew_at = time.monotonic() + self.lease_ttl / 3
        while state.lease == lease:
            now = time.monotonic()
            idle_at = state.idle_since + self.lease_idle if state.idle_since is not None else renew_at
            if state.users == 0 and state.idle_since is not None and now >= idle_at and not state.lock.locked():
                state.users += 1  # not dropped from the table while it releases
                async with state.lock:  # free: taken at once; a request arriving now waits for the release
                    try:
                        if state.lease == lease:
                            state.lease, state.keeper = None, None
                            await self.release(state, lease)
                    finally:
                        state.users -= 1
                return
            if now >= renew_at:
                try:
                    await self.client.control("renew", state.native, lease=lease, ttl=self.lease_ttl)
                except MemTClientError as exc:
                    # a bare 409 (a server that does not name the kind) means the same: the lease is no longer usable
                    if not isinstance(exc.cause, (UnknownSession, LeaseConflict, EpochMismatch)) and type(exc.cause) is not Conflict:
                        log.warning("renewing the lease of %s failed; retrying", state.native, exc_info=True)
                        renew_at = time.monotonic() + 1.0  # e.g. the upstream briefly unreachable: the lease is still ours
                        continue
                    if state.lease == lease:  # the session or the lease is gone: the next request acquires a new one
                        state.lease, state.keeper = None, None
                    return
                renew_at = time.monotonic() + self.lease_ttl / 3
                continue
            state.nudge.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.nudge.wait(), max(0.0, min(renew_at, idle_at) - now))

    async def release(self, state: SessionState, lease: str) -> None:
        """Release ``lease`` (an open transaction upstream is abandoned with it); stop keeping it if it is the session's."""
        if state.lease == lease:
            state.drop_lease()
        deadline = time.monotonic() + RELEASE_WAIT
        while True:
            try:
                await self.client.control("release", state.native, lease=lease)
                return
            except MemTClientError as exc:
                # after a client disconnect the cancelled upstream query may still be in flight for a moment
                if (isinstance(exc.cause, SessionBusy) or type(exc.cause) is Conflict) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    continue
                log.warning("release of %s failed", state.native, exc_info=True)
                return

    # ------------------------------------------------------------------ records

    def set_pending(self, state: SessionState, pending: PendingTurn | None) -> None:
        """Keep (or drop) the turn waiting for tool results, in memory and in the session's record."""
        if pending is None and state.pending is None:
            return
        state.pending = pending
        self._record(state, self.records.save_pending, None if pending is None else asdict(pending))

    def changing(self, state: SessionState, committed: list[str]) -> None:
        """Record, before it happens, that the next published version of the session's memory holds ``committed``."""
        self._record(state, self.records.save, committed)

    def changed(self, state: SessionState, committed: list[str]) -> None:
        """The change recorded by ``changing`` was published (which ends any turn waiting for tool results)."""
        state.committed, state.version, state.history_known, state.pending = committed, state.version + 1, True, None
        self.writes += 1

    def _record(self, state: SessionState, save, *fields) -> None:
        """Write the session's record with ``save`` (a SessionRecordStore method) after its version and committed history."""
        try:
            save(state.native, state.version, state.committed if state.history_known else None, *fields)
        except OSError:
            # without a fresh record a restarted proxy finds no version match: the history counts as unknown
            log.warning("could not write the session record of %s", state.native, exc_info=True)

    # ------------------------------------------------------------------ memory writes

    def pieces(self, ids: list[int]) -> list[list[int]]:
        """``ids`` as commits of at most the upstream's max_prefill_tokens (usually one).

        A prompt that fits can make, with its answer, a turn that does not: rather than lose the answer,
        it goes in several commits of the same transaction, cut at whole ``chunk_tokens`` so the write
        events fall where one commit would put them (each later piece reads the memory as written so far).
        """
        limit = self.max_prefill_tokens
        if not limit or len(ids) <= limit:
            return [ids]
        chunk = self.chunk_tokens or 1
        step = max(chunk, limit - limit % chunk)
        return [ids[i: i + step] for i in range(0, len(ids), step)]

    async def write(self, state: SessionState, lease: str, commits: list[list[int]], committed: list[str]) -> None:
        """begin → one commit per entry of ``commits`` → publish, recorded as leaving ``committed`` in memory.

        A commit refused for the upstream's in-flight commit capacity (429, nothing applied) is retried
        for up to ``COMMIT_CAPACITY_WAIT`` seconds; one whose outcome is uncertain is recovered by receipt.
        """
        write = MemoryWrite(new_transaction(), commits, new_nonce=new_nonce, capacity_wait=COMMIT_CAPACITY_WAIT)
        await self.drive(write, state, lease, committed)

    async def drive(self, write: MemoryWrite, state: SessionState, lease: str, committed: list[str]) -> None:
        """Carry out ``write``'s steps (``memt_core.client.turns``) in ``lease``; the record says, before publish,
        that memory will hold ``committed``. A write left uncertain is resumed once from the upstream's
        receipt (landed commits are not resent); a failure is raised as ProxyError (the caller's release
        of the lease abandons what is left open)."""
        error: MemTClientError | None = None
        resumed = False
        while True:
            step = write.next_step(time.monotonic())
            if step is None and write.outcome == "uncertain" and not resumed:
                resumed = True
                try:
                    await self.client.control("recover", state.native, lease=lease, ttl=self.lease_ttl)
                    status = await self.client.control("status", state.native, lease=lease)
                except MemTClientError:
                    break
                write.resume(status.get("receipts", {}).get(write.transaction))
                continue
            if step is None:
                break
            if isinstance(step, WaitStep):
                await asyncio.sleep(step.seconds)
                continue
            if isinstance(step, PublishStep):
                self.changing(state, committed)
            try:
                result = await self._send(step, state, lease)
            except MemTClientError as exc:
                error = exc
                write.failed(uncertain=exc.uncertain, capacity=getattr(exc, "status", None) == 429, now=time.monotonic())
                continue
            write.succeeded(result)
        if write.outcome == "published":
            self.changed(state, committed)
            return
        raise self.upstream_error(error) if error is not None else ProxyError(503, f"upstream MemT server: the memory write ended {write.outcome}", code="upstream_unavailable")

    async def _send(self, step: Step, state: SessionState, lease: str) -> dict:
        """One step of a memory write as its native request."""
        control, session, transaction = self.client.control, state.native, step.transaction
        if isinstance(step, BeginStep):
            return await control("begin", session, lease=lease, transaction=transaction)
        if isinstance(step, CommitStep):
            return await self.client.commit(session, lease, transaction, step.ids, nonce=step.nonce)
        if isinstance(step, ImportStep):
            return await control("import", session, lease=lease, transaction=transaction, file=step.file, encoding=self.native_encoding)
        if isinstance(step, PublishStep):
            return await control("publish", session, lease=lease, transaction=transaction, memory_read=step.memory_read)
        if isinstance(step, AbortStep):
            return await control("abort", session, lease=lease, transaction=transaction)
        raise TypeError(step)

    async def reset(self, state: SessionState, lease: str | None = None) -> None:
        """Clear the session's memory (in ``lease``, or in the session's kept lease); the caller holds the lock."""
        if lease is None:
            lease = await self.lease_of(state)
        self.changing(state, [])
        await self.call(self.client.control, "reset", state.native, lease=lease)
        self.changed(state, [])

    # ------------------------------------------------------------------ admin

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
                await self.reset(held.state, held.lease)
                return {"reset": True}
            if action == "close":
                await held.close()
                return {"closed": True}
            raise ValueError(action)


class HeldSession:
    """One session held by one request (see ``Sessions.turn``): its state, and its lease once started."""

    def __init__(self, sessions: Sessions, state: SessionState):
        self.sessions = sessions
        self.state = state
        self.lease: str | None = None
        self.later: tuple[list[list[int]], list[str]] | None = None  # a commit left for after the request
        self.kept = False  # the lease was kept from an earlier request (it may have lapsed since)
        self.deferred = False  # the lease is taken while the answer is generated (``start(with_answer=True)``)
        self.creating = False  # the native session too (``start(create=True)``)

    async def start(self, *, with_answer: bool = False, create: bool = False) -> None:
        """Create or adopt the native session, then take its lease: the one kept from an earlier request, or a new one.
        ``with_answer``: a new lease on a session whose memory is empty is taken by ``query`` while it generates;
        ``create`` as well: a session of which nothing is known or recorded is created (or adopted) by ``query`` too,
        which raises ``MemoryFound`` if it turns out to hold memory (e.g. after a restart without records)."""
        state = self.state
        if with_answer and create and not state.exists and state.blank and not self.sessions.records.known(state.native):
            self.deferred = self.creating = True
            return
        await self.sessions.ensure(state)
        self.kept = state.lease is not None
        if with_answer and not self.kept and state.empty:
            self.deferred = True
            return
        self.lease = await self.sessions.lease_of(state)

    async def _leased(self) -> None:
        """Take the lease (and create the session) as ``start`` left to the answer, for a use that cannot overlap it."""
        if self.deferred:
            self.deferred = False
            if self.creating:
                self.creating = False
                await self.sessions.ensure(self.state)
            self.lease = await self.sessions.lease_of(self.state)

    async def _query_leasing(self, prompt: list[int], sampling: dict) -> dict:
        """``query`` on the empty memory of a session not yet leased (or not yet created): a plain generation (an
        empty memory reads as none: the same tokens) while the session is created and leased. If the session turns
        out to hold memory, or another client holds the lease (it may write before letting go), the generation is
        dropped and the query made under the lease once it is ours (after ``MemoryFound``, by the caller)."""
        self.deferred = False
        sessions, state = self.sessions, self.state
        generation = asyncio.ensure_future(sessions.generate(prompt, sampling))
        try:
            if self.creating:
                self.creating = False
                await sessions.ensure(state)
                if not (state.blank and state.empty):
                    raise MemoryFound(state.native)
            self.lease = await sessions.acquire(state, wait=False)
        except BaseException as exc:
            generation.cancel()
            await asyncio.gather(generation, return_exceptions=True)
            if not isinstance(exc, (LeaseTaken, MemoryFound)):
                raise
            self.lease = await sessions.lease_of(state)
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
            await self.sessions.release(self.state, old)
        self.lease = await self.sessions.acquire(self.state)

    async def query(self, prompt: list[int], sampling: dict) -> dict:
        """Generate from ``prompt`` reading the session's memory."""
        if self.deferred:
            return await self._query_leasing(prompt, sampling)
        sessions = self.sessions
        try:
            return await sessions.client.query(self.state.native, self.lease, prompt, sampling_params=sampling)
        except MemTClientError as exc:
            if not self._lapsed(exc):
                raise sessions.upstream_error(exc) from None
            lapsed = exc
        await self._retake(lapsed)
        return await sessions.call(sessions.client.query, self.state.native, self.lease, prompt, sampling_params=sampling)

    async def query_stream(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        """``query`` as cumulative stream bodies; closing the iterator early cancels the upstream query."""
        if self.deferred and not self.creating:
            async for body in self._query_stream_leasing(prompt, sampling):
                yield body
            return
        await self._leased()
        sessions = self.sessions
        upstream = sessions.client.query_stream(self.state.native, self.lease, prompt, sampling_params=sampling)
        try:
            first = await upstream.__anext__()
        except StopAsyncIteration:
            return
        except MemTClientError as exc:
            await upstream.aclose()
            if not self._lapsed(exc):
                raise sessions.upstream_error(exc) from None
            await self._retake(exc)
            async for body in sessions.stream(sessions.client.query_stream(self.state.native, self.lease, prompt, sampling_params=sampling)):
                yield body
            return
        except BaseException:
            await upstream.aclose()
            raise
        yield first
        async for body in sessions.stream(upstream):
            yield body

    async def _query_stream_leasing(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        """``query_stream`` as ``_query_leasing`` makes ``query``: a plain generation's stream, started while the lease
        is taken and passed on only once the lease is ours; were it another client's, dropped for a query under it."""
        self.deferred = False
        sessions = self.sessions
        upstream = sessions.generate_stream(prompt, sampling)
        first = asyncio.ensure_future(anext(upstream, None))
        try:
            try:
                self.lease = await sessions.acquire(self.state, wait=False)
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
            self.lease = await sessions.lease_of(self.state)
            async for body in self.query_stream(prompt, sampling):
                yield body

    async def commit_turn(self, context_ids: list[int], turn_ids: list[int], committed: list[str]) -> None:
        """Write a completed turn (after the uncommitted context before it) into memory, which then holds ``committed``."""
        commits = ([context_ids] if context_ids else []) + self.sessions.pieces(turn_ids)
        await self._leased()
        try:
            await self.sessions.write(self.state, self.lease, commits, committed)
        except ProxyError:
            await self.sessions.settle(self.state, committed)
            self.lease = None
            raise

    def commit_turn_later(self, context_ids: list[int], turn_ids: list[int], committed: list[str]) -> None:
        """``commit_turn``, done once the request lets the session go (its answer is out by then); the session's
        next request waits for it. If it fails, memory stays as it was (see the module docstring)."""
        self.write_later(([context_ids] if context_ids else []) + self.sessions.pieces(turn_ids), committed)

    def write_later(self, commits: list[list[int]], committed: list[str]) -> None:
        """Write ``commits`` (one transaction) once the request lets the session go; memory then holds ``committed``."""
        self.later = (commits, committed)

    async def find(self, session: str) -> dict | None:
        """Adopt the session if it exists upstream; bring it back if its memory is kept elsewhere — offloaded by
        this proxy, unloaded by an upstream with a snapshot store (idle, or a drained node's), or served by
        another node of a cluster (shared records); 404 if none of these (nothing is created). Returns the
        upstream's inspect of a session it held, None for one brought back."""
        sessions, state = self.sessions, self.state
        try:
            native = await sessions.client.control("inspect", state.native)
        except MemTClientError as exc:
            if not isinstance(exc.cause, UnknownSession):
                raise sessions.upstream_error(exc) from None  # e.g. the upstream is unreachable: not a 404
            if state.exists:
                await sessions._reload(state)  # let go upstream (its memory is in the store): bring it back
            elif sessions.records.load_offload(state.native) is not None or sessions.records.recorded_elsewhere(state.native):
                await sessions.ensure(state)
            else:
                raise ProxyError(404, f"session {session!r} does not exist", code="session_not_found") from None
            return None
        if not state.exists:
            sessions.adopt(state, native)
        return native

    async def inspect(self, session: str, native: dict | None = None) -> dict:
        """The session as the proxy and the upstream see it (``find`` first; ``native``: the upstream's inspect
        ``find`` returned, so it is not asked twice)."""
        sessions, state = self.sessions, self.state
        if native is None:
            native = await sessions.call(sessions.client.control, "inspect", state.native)
        return {"session": session, "native": native, "committed_messages": len(state.committed), "history_known": state.history_known, "pending_tool_calls": state.pending is not None}

    async def save(self, file: str, *, overwrite: bool = False, name: str) -> None:
        """Export the published memory as the upstream snapshot ``file`` (the client calls it ``name``)."""
        sessions = self.sessions
        await self._leased()
        try:
            await sessions.client.control("export", self.state.native, lease=self.lease, encoding=sessions.native_encoding, file=file, overwrite=overwrite)
        except MemTClientError as exc:
            raise _renamed(sessions.upstream_error(exc), file, name) from None

    async def restore(self, file: str, *, name: str) -> None:
        """Replace memory with the snapshot ``file`` (begin → import → publish): it then holds no transcript message the proxy knows."""
        write = MemoryWrite(new_transaction(), new_nonce=new_nonce, import_file=file, memory_read=True, abort_on_failure=True)
        await self._leased()
        try:
            await self.sessions.drive(write, self.state, self.lease, [])
        except ProxyError as exc:
            raise _renamed(exc, file, name) from None

    async def close(self) -> None:
        """Delete the native session (the lease goes with it) and its record."""
        sessions, state = self.sessions, self.state
        await self._leased()
        state.drop_lease()  # the renewal task ends before the session does
        await sessions.call(sessions.client.control, "close", state.native, lease=self.lease)
        self.lease = None
        sessions.records.delete(state.native)
        sessions.records.forget_offload(state.native)
        state.forget()


def _renamed(error: ProxyError, file: str, name: str) -> ProxyError:
    """``error`` with the upstream's file name replaced by the client's own name for it."""
    error.message = error.message.replace(file, name)
    return error
