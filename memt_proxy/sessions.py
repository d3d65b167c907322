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
Native sessions are never closed to make room: their memory is the user's; the upstream's own
``--max-sessions-per-rank`` bounds them and answers 429 when full.

A request holds a session with ``turn(tenant, session)``::

    async with sessions.turn(tenant, session) as held:   # the session's lock (bounded wait → 409)
        ...                                               # decide from held.state; a refusal here creates nothing
        await held.start()                                # create or adopt, then the lease (renewed while held)
        body = await held.query(prompt, sampling)
        await held.commit_turn(context_ids, turn_ids, committed)
    # lease released, lock released

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

from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient, new_nonce, new_transaction
from memt_core.client.turns import AbortStep, BeginStep, CommitStep, ImportStep, MemoryWrite, PublishStep, Step, WaitStep
from memt_core.errors import EpochMismatch, LeaseConflict, SessionBusy, SessionExists, UnknownSession
from memt_proxy.errors import ProxyError, from_native
from memt_proxy.store import SessionRecordStore

log = logging.getLogger("memt.proxy")

MAX_SESSIONS = 1024  # default --max-sessions: session states kept in memory
LEASE_TTL = 30  # default native lease lifetime (seconds); renewed while a request holds it
COMMIT_CAPACITY_WAIT = 30.0  # seconds a commit retries while the upstream's in-flight commit capacity is full (429)
RELEASE_WAIT = 10.0  # seconds a release retries while a cancelled query is still winding down upstream


def native_session_id(tenant: str, session: str) -> str:
    """Tenant-scoped, collision-resistant native session ID within the native grammar."""
    return "p-" + hashlib.sha256(f"{tenant}\x00{session}".encode()).hexdigest()[:40]


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
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    committed: list[str] = field(default_factory=list)  # hashes of committed messages, in order
    history_known: bool = True  # False when we adopted a native session whose history we never saw
    pending: PendingTurn | None = None
    exists: bool = False
    version: int = 0  # the upstream's published_version of the memory that ``committed`` describes
    keeper: asyncio.Task | None = None  # renews the native lease while a request holds it
    users: int = 0  # requests holding or waiting for this state: while any, it is never dropped

    def forget(self) -> None:
        """The native session is gone (closed, or the upstream restarted): start over on next use."""
        self.exists, self.version, self.committed, self.pending, self.history_known = False, 0, [], None, True


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
            state = self._states[key] = SessionState(native=native_session_id(tenant, session))
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
        for key, state in self._states.items():  # least recently used first
            if state.users == 0:
                del self._states[key]
                self.dropped += 1
                return
        raise ProxyError(
            429, f"the proxy is serving {self.capacity} sessions at once (--max-sessions); retry when one finishes",
            code="too_many_sessions",
        )


class Sessions:
    """The sessions of one upstream: table, locks, leases, records, the memory-write sequence, admin."""

    def __init__(
        self,
        client: AsyncNativeClient,
        *,
        identity: str | None,
        records: SessionRecordStore | None = None,
        max_sessions: int = MAX_SESSIONS,
        lease_wait: float = 30.0,
        lease_ttl: int = LEASE_TTL,
        native_encoding: str | None = None,
    ):
        self.client = client
        self.identity = identity  # the model/tokenizer identity the upstream must serve
        self.records = records or SessionRecordStore(None)
        self.table = SessionTable(max_sessions)
        self.lease_wait = lease_wait
        self.lease_ttl = lease_ttl
        self.native_encoding = native_encoding  # snapshot encoding of save/restore
        self.max_prefill_tokens: int | None = None
        self.chunk_tokens: int | None = None
        self._upstream_checked = False

    # ------------------------------------------------------------------ upstream

    async def check_upstream(self) -> None:
        """The upstream must serve the checkpoint this proxy encodes prompts for; learn its limits."""
        if self._upstream_checked:
            return
        try:
            capabilities = await self.client.capabilities(refresh=True)
        except MemTClientError as exc:
            raise from_native(exc) from None
        if capabilities.get("identity") != self.identity:
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
        """Hold the session for one request: its lock now, its lease from ``start()``, both released on exit."""
        state = self.table.take(tenant, session)
        try:
            try:
                await asyncio.wait_for(state.lock.acquire(), timeout=self.lease_wait)
            except asyncio.TimeoutError:
                raise ProxyError(409, f"session busy: another request on this session is still running after {self.lease_wait:.0f}s; retry later", code="session_busy") from None
            held = HeldSession(self, state)
            try:
                yield held
            finally:
                try:
                    if held.lease is not None:
                        await self.release(state, held.lease)
                finally:
                    state.lock.release()
        finally:
            self.table.give_back(state)

    async def ensure(self, state: SessionState) -> None:
        """Create the native session, or adopt it if it exists already (e.g. made by an earlier proxy)."""
        if state.exists:
            return
        try:
            await self.client.control("create", state.native, memory_read=True)
        except MemTClientError as exc:
            # errors rebuilt from the wire carry the generic class of their status (Conflict), not SessionExists
            if not isinstance(exc.cause, SessionExists):
                raise self.upstream_error(exc) from None
            self.adopt(state, await self.call(self.client.control, "inspect", state.native))
            return
        self.records.delete(state.native)  # a record from an earlier life of this id (before an upstream restart)
        state.exists, state.version, state.committed, state.history_known = True, 0, [], True

    def adopt(self, state: SessionState, native: dict) -> None:
        """Take over a native session that exists upstream: its record, if one matches its version, says
        what memory holds and which turn, if any, waits for tool results."""
        version = native["published_version"]
        committed = self.records.load(state.native, version)
        state.exists, state.version = True, version
        state.committed, state.history_known = committed or [], committed is not None
        pending = self.records.load_pending(state.native, version) if committed is not None else None
        state.pending = PendingTurn(**pending) if pending is not None else None

    async def acquire(self, state: SessionState) -> str:
        """The native lease (waiting up to ``lease_wait`` while another client holds it), renewed until released."""
        deadline = time.monotonic() + self.lease_wait
        while True:
            try:
                lease = (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]
                break
            except MemTClientError as exc:
                if not isinstance(exc.cause, LeaseConflict) or time.monotonic() > deadline:
                    raise self.upstream_error(exc) from None
            await asyncio.sleep(0.2)
        state.keeper = asyncio.get_running_loop().create_task(self._keep(state, lease))
        return lease

    async def _keep(self, state: SessionState, lease: str) -> None:
        """Renew the lease every third of its lifetime until released: long generations keep it, and
        a proxy that dies leaves its sessions leased for at most ``lease_ttl`` seconds."""
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                await self.client.control("renew", state.native, lease=lease, ttl=self.lease_ttl)
            except MemTClientError:
                log.warning("renewing the lease of %s failed", state.native, exc_info=True)
                return

    async def release(self, state: SessionState, lease: str) -> None:
        """Stop renewing and release the lease (an open transaction upstream is abandoned with it)."""
        if state.keeper is not None:
            state.keeper.cancel()
            state.keeper = None
        deadline = time.monotonic() + RELEASE_WAIT
        while True:
            try:
                await self.client.control("release", state.native, lease=lease)
                return
            except MemTClientError as exc:
                # after a client disconnect the cancelled upstream query may still be in flight for a moment
                if isinstance(exc.cause, SessionBusy) and time.monotonic() < deadline:
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
        """Clear the session's memory (in ``lease``, or in a lease of its own); the caller holds the lock."""
        if lease is None:
            lease = await self.acquire(state)
            try:
                await self.reset(state, lease)
            finally:
                await self.release(state, lease)
            return
        self.changing(state, [])
        await self.call(self.client.control, "reset", state.native, lease=lease)
        self.changed(state, [])

    # ------------------------------------------------------------------ admin

    async def admin(self, tenant: str, session: str, action: str, **fields) -> dict:
        """inspect | save | restore | reset | close, under the session's lock (and lease, but for inspect)."""
        await self.check_upstream()
        async with self.turn(tenant, session) as held:
            if action == "inspect":
                return await held.inspect(session)
            await held.start()
            if action == "save":
                return {"snapshot": await held.save(**fields)}
            if action == "restore":
                await held.restore(**fields)
                return {"restored": fields["name"]}
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

    async def ensure(self) -> None:
        """Create or adopt the native session (``state.history_known`` says whether its history is known)."""
        await self.sessions.ensure(self.state)

    async def start(self) -> None:
        """Create or adopt the native session, then take its lease (renewed until the turn ends)."""
        await self.sessions.ensure(self.state)
        self.lease = await self.sessions.acquire(self.state)

    async def query(self, prompt: list[int], sampling: dict) -> dict:
        """Generate from ``prompt`` reading the session's memory."""
        return await self.sessions.call(self.sessions.client.query, self.state.native, self.lease, prompt, sampling_params=sampling)

    def query_stream(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        """``query`` as cumulative stream bodies; closing the iterator early cancels the upstream query."""
        return self.sessions.stream(self.sessions.client.query_stream(self.state.native, self.lease, prompt, sampling_params=sampling))

    async def commit_turn(self, context_ids: list[int], turn_ids: list[int], committed: list[str]) -> None:
        """Write a completed turn (after the uncommitted context before it) into memory, which then holds ``committed``."""
        commits = ([context_ids] if context_ids else []) + self.sessions.pieces(turn_ids)
        await self.sessions.write(self.state, self.lease, commits, committed)

    async def inspect(self, session: str) -> dict:
        """The session as the proxy and the upstream see it; 404 if neither has it."""
        sessions, state = self.sessions, self.state
        if not state.exists:
            try:
                native = await sessions.client.control("inspect", state.native)
            except MemTClientError as exc:
                if not isinstance(exc.cause, UnknownSession):
                    raise sessions.upstream_error(exc) from None  # e.g. the upstream is unreachable: not a 404
                raise ProxyError(404, f"session {session!r} does not exist", code="session_not_found") from None
            sessions.adopt(state, native)
        else:
            native = await sessions.call(sessions.client.control, "inspect", state.native)
        return {"session": session, "native": native, "committed_messages": len(state.committed), "history_known": state.history_known, "pending_tool_calls": state.pending is not None}

    async def save(self, name: str | None = None, overwrite: bool = False) -> str:
        """Export the published memory as a snapshot on the upstream; returns its file name."""
        sessions = self.sessions
        result = await sessions.call(sessions.client.control, "export", self.state.native, lease=self.lease, encoding=sessions.native_encoding, file=name, overwrite=overwrite)
        return result["file"]

    async def restore(self, name: str) -> None:
        """Replace memory with a snapshot (begin → import → publish): it then holds no transcript message the proxy knows."""
        write = MemoryWrite(new_transaction(), new_nonce=new_nonce, import_file=name, memory_read=True, abort_on_failure=True)
        await self.sessions.drive(write, self.state, self.lease, [])

    async def close(self) -> None:
        """Delete the native session (the lease goes with it) and its record."""
        sessions, state = self.sessions, self.state
        await sessions.call(sessions.client.control, "close", state.native, lease=self.lease)
        if state.keeper is not None:
            state.keeper.cancel()
            state.keeper = None
        self.lease = None
        sessions.records.delete(state.native)
        state.forget()
