"""Memory writes: the ``MemoryWrite`` plan driven over native requests, records kept before each change, a
failed write settled."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict

from memt_core.client.errors import MemTClientError
from memt_core.client.native import new_nonce, new_transaction
from memt_core.client.turns import (
    AbortStep,
    BeginStep,
    CommitStep,
    ImportStep,
    MemoryWrite,
    PublishStep,
    Step,
    WaitStep,
)
from memt_proxy.errors import Unavailable
from memt_proxy.session.leases import Leases
from memt_proxy.session.state import COMMIT_CAPACITY_WAIT, PendingTurn, SessionState
from memt_proxy.session.store import SessionRecordStore
from memt_proxy.session.upstream import Upstream

log = logging.getLogger("memt.proxy")


class Writes:
    """The memory-write sequence on ``upstream`` in a lease of ``leases``, and the ``records`` around it."""

    def __init__(self, upstream: Upstream, leases: Leases, records: SessionRecordStore, *, native_encoding: str | None):
        self.upstream = upstream
        self.client = upstream.client
        self.leases = leases
        self.records = records
        self.native_encoding = native_encoding  # snapshot encoding of imports
        self.published = 0  # memory writes published, since start

    def set_pending(self, state: SessionState, pending: PendingTurn | None) -> None:
        """Keep (or drop) the turn waiting for tool results, in memory and in the session's record."""
        if pending is None and state.pending is None:
            return
        state.pending = pending
        self.record(state, self.records.save_pending, None if pending is None else asdict(pending))

    def changing(self, state: SessionState, committed: list[str]) -> None:
        """Record, before it happens, that the next published version of the session's memory holds ``committed``."""
        answered = state.last_turn if isinstance(state.last_turn, dict) and state.last_turn.get("version") == state.version + 1 else None
        self.record(state, self.records.save, committed, answered)

    def changed(self, state: SessionState, committed: list[str]) -> None:
        """The change recorded by ``changing`` was published (which ends any turn waiting for tool results)."""
        state.published(committed)
        self.published += 1

    def record(self, state: SessionState, save, *fields) -> None:
        """Write the session's record with ``save`` (a SessionRecordStore method) after its version and committed history."""
        try:
            save(state.native, state.version, state.committed if state.history_known else None, *fields)
        except OSError as exc:
            # without a fresh record a restarted proxy finds no version match: the history counts as unknown
            log.warning("could not write the session record of %s: %s", state.native, exc)

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
                    await self.client.control("recover", state.native, lease=lease, ttl=self.leases.lease_ttl)
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
        raise self.upstream.error(error) if error is not None else Unavailable(f"upstream MemT server: the memory write ended {write.outcome}", code="upstream_unavailable")

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

    async def reset(self, state: SessionState, lease: str) -> None:
        """Clear the session's memory in ``lease``; the caller holds the lock."""
        self.changing(state, [])
        await self.upstream.call(self.client.control, "reset", state.native, lease=lease)
        self.changed(state, [])

    async def settle(self, state: SessionState, committed: list[str]) -> None:
        """After a failed write: release the lease (abandoning a transaction left open), then learn from the
        upstream whether the write was published after all (memory holds ``committed``) or not (as it was);
        if neither, the session is adopted again on its next request."""
        lease = state.drop_lease()
        if lease is not None:
            await self.leases.release(state, lease)
        try:
            version = (await self.client.control("inspect", state.native))["published_version"]
        except MemTClientError:
            version = None
        if version == state.version + 1:
            self.changed(state, committed)
        elif version != state.version:
            state.let_go()

