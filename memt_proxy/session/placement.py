"""Where a session's memory lives: created, adopted (with its record), offloaded to a snapshot to make room (a kept
state: closed, ``memt_proxy.session.kept``) and restored, reloaded after the upstream let it go, handed off (unload)."""

from __future__ import annotations

import logging
from dataclasses import asdict

from memt_core.client.errors import MemTClientError
from memt_core.client.native import new_nonce, new_transaction
from memt_core.client.turns import MemoryWrite
from memt_core.errors import SessionExists, UnknownSession
from memt_proxy.errors import Conflict, ProxyError
from memt_proxy.session.kept import KeptStates
from memt_proxy.session.leases import Leases
from memt_proxy.session.state import (
    OFFLOAD_PREFIX, OFFLOAD_TRIES, NotHeld, PendingTurn, SessionState, SessionTable, evicted_first, native_session_id, offload_file,
)
from memt_proxy.session.store import SessionRecordStore
from memt_proxy.session.upstream import Upstream
from memt_proxy.session.writes import Writes

log = logging.getLogger("memt.proxy")

RECORDED_TRIES = 8  # recorded sessions tried, at most, per attempt to make room among them


class Placement:
    """Where each session of ``table`` lives on ``upstream`` (leased through ``leases``, restored through ``writes``,
    recorded in ``records``); an idle kept state offloaded to make room is closed through ``kept``."""

    def __init__(self, upstream: Upstream, leases: Leases, writes: Writes, records: SessionRecordStore, table: SessionTable, kept: KeptStates):
        self.upstream = upstream
        self.client = upstream.client
        self.leases = leases
        self.writes = writes
        self.records = records
        self.table = table
        self.kept = kept
        self._recorded: list | None = None  # sessions the records name, not yet tried for offloading (``offload_recorded``)
        self.offloads = 0  # native sessions offloaded to make room, since start
        self.restores = 0  # offloaded sessions restored, since start

    async def ensure(self, state: SessionState) -> None:
        """Create the native session, or adopt it if it exists already (e.g. made by an earlier proxy),
        or restore it if it was offloaded."""
        if state.exists:
            return
        offloaded = self.records.load_offload(state.native)
        if not await self._create(state):
            await self.upstream.call(self.adopt_existing, state, required=True)
            return
        if offloaded is not None:
            await self._restore(state, offloaded)
            return
        # a record from an earlier life of this id (before an upstream restart); a kept state's own record, written
        # just before its creation, stays
        self.records.delete(state.native, kept=False)
        state.created()

    async def copy(self, state: SessionState, source: SessionState, lease: str, *, make_room: bool = True) -> None:
        """Create ``state``'s native session as a copy of ``source``'s published memory (``lease``: ``source``'s):
        it then holds what ``source`` holds, at version 0, until its first write. ``make_room``: see ``_create``."""
        if not await self._create(state, make_room=make_room, source=source.native, source_lease=lease):
            raise Conflict(f"session {state.native} exists already", code="session_exists")
        state.created(source.committed)

    async def _create(self, state: SessionState, *, make_room: bool = True, **fields) -> bool:
        """Create the native session (``fields``: a copy's ``source`` and ``source_lease``), or find it exists (False:
        made earlier, or restored from the upstream's snapshot store, so adopted at its version); when the upstream
        is full, offload idle sessions to make room (up to ``OFFLOAD_TRIES``; none without ``make_room``) before
        passing its 429 on."""
        for attempt in range(OFFLOAD_TRIES + 1 if make_room else 1):
            try:
                created = await self.client.control("create", state.native, memory_read=True, **fields)
                # a core with a snapshot store restored it (after a crash, or from another node): it is not new
                return not created.get("restored_version")
            except MemTClientError as exc:
                # errors rebuilt from the wire carry the generic class of their status (Conflict), not SessionExists
                if isinstance(exc.cause, SessionExists):
                    return False
                if getattr(exc, "status", None) != 429 or not make_room or attempt == OFFLOAD_TRIES or not await self.offload_idle(state):
                    raise self.upstream.error(exc) from None
        raise AssertionError("unreachable")

    async def offload_idle(self, keep: SessionState) -> bool:
        """Offload the least recently used idle session with a native session (never ``keep``), a header-less state a
        later turn extended first (``evicted_first``); False if none could be. With none in the table (a restarted
        proxy's is empty while the upstream is full of sessions an earlier one made), one of the sessions the records
        name (``offload_recorded``)."""
        for state in evicted_first(self.table):
            if state is not keep and state.exists and state.users == 0 and not state.lock.locked():
                self.kept.evicting(state, "the upstream has no room for another session")
                if await self.offload(state):
                    return True
        return await self.offload_recorded(keep)

    async def offload_recorded(self, keep: SessionState) -> bool:
        """Offload (a kept state: close) a native session the records name and the table does not hold,
        idle upstream (its lease free); False if none could be now. The records are listed once per process and tried
        ``RECORDED_TRIES`` at a time in turn; one that could not be offloaded (e.g. still leased by a proxy killed a
        moment ago, until that lease lapses) goes to the end of the list, for a later request; one gone upstream is
        dropped."""
        if self._recorded is None:
            kept = {native_session_id(k["tenant"], k["name"]): k for k in self.records.kept_states()}
            self._recorded = [(native, kept.get(native)) for native in self.records.sessions()]
        held = {state.native for state in self.table}
        for _ in range(min(RECORDED_TRIES, len(self._recorded))):
            native, record = entry = self._recorded.pop(0)
            if native == keep.native or native in held:
                self._recorded.append(entry)
                continue
            state = SessionState(native=native, tenant=record["tenant"] if record else "", name=record["name"] if record else "")
            try:
                if await self.adopt_existing(state) is None:
                    continue  # gone upstream: nothing to offload
            except MemTClientError:
                self._recorded.append(entry)  # the upstream briefly away: later
                continue
            if await self.offload(state):
                log.info("offloaded %s, a session recorded before this proxy started, to make room", native)
                return True
            self._recorded.append(entry)  # leased (by a proxy killed a moment ago, until the lease lapses): later
        return False

    async def offload(self, state: SessionState) -> bool:
        """Export an idle session's published memory, record where, and close its native session (see the
        module docstring); False, changing nothing, if it is busy or the upstream refuses."""
        if state.users or state.lock.locked() or not state.exists:
            return False
        with state.in_use():
            await state.lock.acquire()  # free: taken at once
            try:
                return await self._offload(state)
            finally:
                state.lock.release()

    async def _offload(self, state: SessionState) -> bool:
        """``offload`` with the state in use and its lock held."""
        try:
            try:
                lease = await self.leases.one_shot(state)
            except MemTClientError:
                return False  # leased by another client, or gone: not ours to offload now
            if state.is_kept:
                return await self.kept.close(state, lease)
            try:
                # a name of its own (not the content's: equal memories would share one file), deleted once restored
                exported = await self.client.control("export", state.native, lease=lease, encoding=self.writes.native_encoding, file=offload_file(state.native))
                file = exported["file"]
            except MemTClientError as exc:
                if getattr(exc, "status", None) != 400:
                    await self.leases.release_once(state, lease)
                    return False
                file = None  # the upstream cannot export (no state directory): close it all the same, losing its memory
                log.warning("offloading %s without a snapshot: the upstream cannot export (%s); its memory is lost", state.native, exc.message)
            if file is not None:
                pending = asdict(state.pending) if state.pending is not None else None
                try:
                    self.records.save_offload(state.native, file, state.committed if state.history_known else None, pending)
                except OSError as exc:  # a full or read-only --state-directory: without its record the snapshot is never found again
                    log.warning("not offloading %s: its offload record could not be written (%s)", state.native, exc)
                    await self.leases.release(state, lease)
                    return False
            await self.client.control("close", state.native, lease=lease)
            if file is None:
                self.records.delete(state.native)
                state.forget()
            else:
                state.offloaded()
            self.offloads += 1
            return True
        except MemTClientError as exc:
            log.warning("offloading %s failed: %s", state.native, exc.message)
            return False

    async def _restore(self, state: SessionState, offloaded: dict) -> None:
        """Load an offloaded session's snapshot into its new native session (begin → import → publish)."""
        state.adopted(0, offloaded["committed"])
        lease = await self.lease_of(state)  # kept for the request that brought the session back
        try:
            write = MemoryWrite(new_transaction(), new_nonce=new_nonce, import_file=offloaded["file"], memory_read=True, abort_on_failure=True)
            await self.writes.drive(write, state, lease, state.committed)
            state.history_known = offloaded["committed"] is not None
        except ProxyError as exc:
            # the snapshot is gone or damaged: the session goes on with empty memory, rebuilt from resent transcripts
            log.warning("restoring offloaded %s from %s failed (%s); it starts with empty memory", state.native, offloaded["file"], exc.message)
            state.created()
        self.records.forget_offload(state.native)
        await self._delete_offload_file(offloaded["file"], state, lease)
        if offloaded.get("pending") is not None and state.committed == (offloaded["committed"] or []):
            self.writes.set_pending(state, PendingTurn(**offloaded["pending"]))
        self.restores += 1

    async def _delete_offload_file(self, file: str, state: SessionState, lease: str) -> None:
        """Delete an offload snapshot once nothing needs it, in the lease of the session restored from it (a snapshot
        named by its content, as earlier proxies made them, may be shared and stays). An upstream without the
        ``delete_snapshot`` extension (or serving the spec strictly) keeps it."""
        if not file.startswith(OFFLOAD_PREFIX):
            return
        try:
            await self.client.control("delete_snapshot", state.native, lease=lease, file=file)
        except MemTClientError as exc:
            log.info("offload snapshot %s not deleted: %s", file, exc.message)

    def adopt(self, state: SessionState, native: dict) -> None:
        """Take over a native session that exists upstream: its record, if one matches its version, says
        what memory holds and which turn, if any, waits for tool results."""
        version = native["published_version"]
        committed = self.records.load(state.native, version)
        if committed is None and version == 0:
            committed = []  # never published to: its memory is empty (e.g. a proxy died before its first commit)
        state.adopted(version, committed)
        pending = self.records.load_pending(state.native, version) if committed is not None else None
        state.pending = PendingTurn(**pending) if pending is not None else None
        state.last_turn = self.records.load_answer(state.native, version) if committed is not None else None

    async def adopt_existing(self, state: SessionState, *, adopt: bool = True, required: bool = False) -> dict | None:
        """Adopt ``state``'s native session as the upstream holds it (its inspect, then ``adopt``): the one way a session
        found upstream is taken over. Returns the inspect; None, adopting nothing, where the upstream holds no such
        session (``required``: its error is raised then too); ``adopt=False``: only the inspect. Any other failure is
        the client's error (``MemTClientError``): the caller decides."""
        try:
            native = await self.client.control("inspect", state.native)
        except MemTClientError as exc:
            if required or not isinstance(exc.cause, UnknownSession):
                raise
            return None
        if adopt:
            self.adopt(state, native)
        return native

    async def adopt_recorded(self, state: SessionState) -> None:
        """Adopt a session this proxy (or an earlier one) recorded, before its request is looked at: its record
        says what memory holds and which answer its last turn had (an identical retry gets it again)."""
        if not state.exists and self.records.known(state.native):
            await self.upstream.call(self.adopt_existing, state)

    async def acquire(self, state: SessionState, *, wait: bool = True) -> str:
        """``Leases.acquire``; a session the upstream let go (``NotHeld``) is brought back first (``reload``), once."""
        try:
            return await self.leases.acquire(state, wait=wait)
        except NotHeld:
            await self.reload(state)
        try:
            return await self.leases.acquire(state, wait=wait)
        except NotHeld as gone:
            raise gone.error from None

    async def lease_of(self, state: SessionState) -> str:
        """The session's kept lease, or a new one (``acquire``, kept from now on); the caller holds the lock."""
        return state.lease if state.lease is not None else await self.acquire(state)

    async def reload(self, state: SessionState) -> None:
        """Create the session again upstream, where its durable memory is restored, and adopt it; what this
        proxy knew of its memory stays when the version is the one it knew."""
        version, committed, known, pending = state.version, state.committed, state.history_known, state.pending
        state.let_go()
        await self.ensure(state)
        if state.version == version and not state.history_known:
            state.committed, state.history_known, state.pending = committed, known, pending
        log.info("%s was no longer held upstream: restored at version %d", state.native, state.version)

    async def unload(self, state: SessionState) -> bool:
        """Hand the session off: the upstream frees it and gives up its ownership, keeping its memory in the
        snapshot store, so that the server a router sends it to next takes it over (``POST /admin/drain``).
        False (and only the lease released) where the upstream cannot: no snapshot store, or not this server."""
        try:
            lease = await self.leases.one_shot(state)
        except MemTClientError as exc:
            if isinstance(exc.cause, UnknownSession):
                state.let_go()  # its upstream let it go already (idle): nothing left to hand off
                return True
            log.info("%s not unloaded (%s)", state.native, exc.message)
            return False
        try:
            await self.client.control("unload", state.native, lease=lease)
        except MemTClientError as exc:
            log.info("%s not unloaded (%s); its lease is released", state.native, exc.message)
            await self.leases.release(state, lease)
            return False
        state.let_go()  # a later request here restores it (``reload`` through ``ensure``)
        return True
