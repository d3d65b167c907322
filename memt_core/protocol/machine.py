"""The memt-http-v1 session state machine: sessions, leases, transactions, epochs, nonces, receipts.

Rules of this file:

* No I/O. Time arrives as ``now`` (seconds on a monotonic clock); lease tokens come from an injected
  factory. Nothing here imports asyncio, HTTP or torch.
* A control action is *planned*, then *completed*. ``control()`` checks everything and reserves the
  session, returning a ``Plan`` whose ``effects`` the engine must carry out; ``complete()`` applies the
  state change once they succeeded and returns the response body; ``abandon()`` drops the reservation
  when they failed. A refused or failed action therefore changes nothing.
* Generation requests are bracketed the same way: ``start_query``/``finish_query`` and
  ``start_commit``/``finish_commit``. A session runs one request or control action at a time.
* Every refusal is a typed error from ``memt_core.errors`` carrying its HTTP status.

Invariants (DESIGN §5): published memory changes only through publish, reset or close; one lease per
session; one open transaction per session; a nonce is accepted once per session; commit receipts say
exactly which commits landed; capacity limits answer 429 instead of queueing.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict, deque
from typing import Any, Callable

from memt_core.errors import (
    CapacityExceeded, EpochMismatch, InvalidRequest, LeaseConflict, NonceReused, SessionBusy, SessionExists,
    TransactionConflict, UnknownSession,
)
from memt_core.protocol import effects as fx
from memt_core.protocol.events import (
    Abort, Acquire, Action, Begin, Cancel, Close, Commit, Create, DeleteSnapshot, Export, Import, Inspect, KvReset,
    MemoryRead, Publish, Query, Recover, Release, Renew, Reset, Status, Unload, check_snapshot_name,
)
from memt_core.protocol.guards import open_transaction, require_certain, require_idle, resolve_unknown
from memt_core.protocol.state import (  # noqa: F401 (PENDING and the dataclasses are re-exported)
    APPLIED, FAILED, PENDING, UNKNOWN, CommitReceipt, Lease, Limits, Plan, Session, Ticket, Transaction, _same_token,
)


class MemTProtocol:
    """All sessions of one server epoch."""

    def __init__(self, *, epoch: str, limits: Limits = Limits(), new_token: Callable[[], str] | None = None):
        self.epoch = epoch
        self.limits = limits
        self.sessions: dict[str, Session] = {}
        self.inflight_commits = 0
        self.reads: OrderedDict[str, deque] = OrderedDict()  # session → its latest finished queries
        self._creating: set[str] = set()
        self._new_token = new_token or (lambda: secrets.token_urlsafe(18))
        self._handlers: dict[type, Callable[[Any, float], Plan]] = {
            Create: self._create, Acquire: self._acquire, Renew: self._renew, Release: self._release,
            Begin: self._begin, Abort: self._abort, Publish: self._publish, MemoryRead: self._memory_read,
            Export: self._export, Import: self._import, Inspect: self._inspect, Status: self._status,
            Recover: self._recover, Cancel: self._cancel, KvReset: self._kv_reset, Reset: self._reset,
            Close: self._close, Unload: self._unload, DeleteSnapshot: self._delete_snapshot,
        }

    # ------------------------------------------------------------------ control actions

    def control(self, action: Action, now: float) -> Plan:
        """Check ``action`` and reserve its session; raises a typed error and changes nothing on refusal."""
        self._check_epoch(action.epoch)
        plan = self._handlers[type(action)](action, now)
        if plan.reserved and plan.session in self.sessions:
            self.sessions[plan.session].reserved = plan.name
        return plan

    def complete(self, plan: Plan, results: list[Any], now: float) -> dict:
        """Apply a plan whose effects succeeded; returns the response body."""
        session = self.sessions.get(plan.session)
        if session is not None and plan.reserved:
            session.reserved = None
        if isinstance(plan.action, Create):
            self._creating.discard(plan.session)
        return plan.apply(results, now)

    def abandon(self, plan: Plan) -> None:
        """The plan's effects failed: release the reservation, change nothing else."""
        session = self.sessions.get(plan.session)
        if session is not None and plan.reserved:
            session.reserved = None
        if isinstance(plan.action, Create):
            self._creating.discard(plan.session)

    def _plan(self, action: Action, session: str, effects: tuple = (), apply=None, reserved: bool = True) -> Plan:
        return Plan(action=action, session=session, effects=tuple(effects), apply=apply or (lambda r, now: {}), reserved=reserved)

    def _check_epoch(self, epoch: str | None) -> None:
        if epoch is not None and epoch != self.epoch:
            raise EpochMismatch(
                f"epoch {epoch!r} is not this server's epoch {self.epoch!r}: the server restarted; "
                "create a new session and import a confirmed snapshot"
            )

    def _session(self, name: str) -> Session:
        session = self.sessions.get(name)
        if session is None:
            raise UnknownSession(f"session {name!r} does not exist")
        if session.reserved is not None:
            raise SessionBusy(f"session {name!r} is busy with a {session.reserved!r} action")
        return session

    def _leased(self, action: Action, now: float, *, allow_expired: bool = False) -> Session:
        session = self._session(action.session)
        lease = session.lease
        if lease is None or not _same_token(lease.token, action.lease):
            raise LeaseConflict(f"the lease is not valid for session {action.session!r} (missing, wrong, or released)")
        if not allow_expired and not lease.valid(now):
            raise LeaseConflict(f"the lease on session {action.session!r} expired; acquire a new one")
        return session

    def _abandon_open(self, session: Session, txn: Transaction | None) -> str | None:
        """Abandon the open transaction as the lease ends; returns the one the lease left open, whether it is
        abandoned now or the reaper already did (so the answer does not depend on when the reaper ran)."""
        if txn is not None:
            self._archive(session, txn, "abandoned")
        abandoned, session.lapsed = (txn.name if txn else session.lapsed), None
        return abandoned

    def _archive(self, session: Session, txn: Transaction, state: str) -> None:
        txn.state = state
        session.transaction = None
        session.history[txn.name] = txn
        while len(session.history) > self.limits.receipts_kept:
            session.history.popitem(last=False)

    def _create(self, a: Create, now: float) -> Plan:
        name = a.session or f"s-{self._new_token()}"
        if name in self.sessions or name in self._creating:
            raise SessionExists(f"session {name!r} already exists")
        if len(self.sessions) + len(self._creating) >= self.limits.max_sessions:
            raise CapacityExceeded(f"session capacity reached ({self.limits.max_sessions} sessions per rank); close a session first")
        if a.retain_kv and not self.limits.retain_kv_enabled:
            raise InvalidRequest("retain_kv requires a server started with --enable-streaming-session")
        effects: tuple = (fx.NewMemory(name),)
        if a.source is not None:
            source = self._session(a.source)
            if source.lease is None or not source.lease.valid(now) or not _same_token(source.lease.token, a.source_lease):
                raise LeaseConflict(f"copying session {a.source!r} needs its valid lease in 'source_lease'")
            effects = (fx.CopyMemory(name, source=a.source),)
        elif a.source_lease is not None:
            raise InvalidRequest("'source_lease' is only meaningful with 'source'")
        self._creating.add(name)

        def apply(results, now):
            # the engine answers NewMemory with the version it restored from durable memory (0: new)
            restored = results[0] if a.source is None and isinstance(results[0], int) else 0
            self.sessions[name] = Session(id=name, memory_read=a.memory_read, retain_kv=a.retain_kv, published_version=restored, copied=a.source is not None)
            body = {"session": name, "memory_read": a.memory_read, "retain_kv": a.retain_kv, "source": a.source}
            if restored:
                body["restored_version"] = restored
            return body

        return self._plan(a, name, effects, apply, reserved=False)

    def _acquire(self, a: Acquire, now: float) -> Plan:
        session = self._session(a.session)
        require_idle(session, "acquire")
        if session.lease is not None and session.lease.valid(now):
            raise LeaseConflict(f"session {a.session!r} is leased by another client for {session.lease.expires_at - now:.0f} more seconds")
        txn = session.transaction
        effects = (fx.DropCandidate(session.id, transaction=txn.name),) if txn else ()

        def apply(results, now):
            abandoned = self._abandon_open(session, txn)
            session.lease = Lease(self._new_token(), now + a.ttl)
            return {"session": session.id, "lease": session.lease.token, "ttl": a.ttl, "abandoned_transaction": abandoned}

        return self._plan(a, session.id, effects, apply)

    def _renew(self, a: Renew, now: float) -> Plan:
        session = self._leased(a, now)

        def apply(results, now):
            session.lease.expires_at = now + a.ttl
            return {"session": session.id, "lease": session.lease.token, "ttl": a.ttl}

        return self._plan(a, session.id, (), apply)

    def _release(self, a: Release, now: float) -> Plan:
        """Reconcile outstanding work, then release: in-flight queries are cancelled, uncertain receipts
        resolved from the engine, the open transaction abandoned; an in-flight commit finishes into the
        abandoned transaction's receipts (it can no longer publish)."""
        session = self._leased(a, now, allow_expired=True)
        txn = session.transaction
        queries = sorted(rid for rid, kind in session.in_flight.items() if kind == "query")
        commits = sorted(rid for rid, kind in session.in_flight.items() if kind == "commit")
        reconcile = bool(txn and session.uncertain)
        effects = [fx.CancelRequest(session.id, rid=rid) for rid in queries]
        if reconcile:
            effects.append(fx.ReconcileCommits(session.id, transaction=txn.name))
        if txn:
            effects.append(fx.DropCandidate(session.id, transaction=txn.name))

        def apply(results, now):
            if session.uncertain:
                resolve_unknown(session, txn, set(results[len(queries)]) if reconcile else None)
            abandoned = self._abandon_open(session, txn)
            session.lease, session.released_at = None, now
            return {
                "session": session.id, "released": True, "abandoned_transaction": abandoned,
                "cancelled_requests": queries, "pending_commits": commits, "reconciled": reconcile,
            }

        return self._plan(a, session.id, effects, apply)

    def _begin(self, a: Begin, now: float) -> Plan:
        session = self._leased(a, now)
        require_certain(session)
        if session.transaction is not None:
            raise TransactionConflict(f"session {session.id!r} already has open transaction {session.transaction.name!r}")
        if a.transaction in session.history:
            raise TransactionConflict(f"transaction name {a.transaction!r} was already used on session {session.id!r}")

        def apply(results, now):
            session.lapsed = None  # the lease's open transaction is this one now
            session.transaction = Transaction(a.transaction)
            session.history[a.transaction] = session.transaction
            return {"session": session.id, "transaction": a.transaction, "state": "open"}

        return self._plan(a, session.id, (fx.ForkCandidate(session.id, transaction=a.transaction),), apply)

    def _abort(self, a: Abort, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "abort")
        txn = open_transaction(session, a.transaction)

        def apply(results, now):
            self._archive(session, txn, "aborted")
            return {"session": session.id, "transaction": txn.name, "state": "aborted"}

        return self._plan(a, session.id, (fx.DropCandidate(session.id, transaction=txn.name),), apply)

    def _publish(self, a: Publish, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "publish")
        require_certain(session)
        txn = open_transaction(session, a.transaction)

        def apply(results, now):
            self._archive(session, txn, "published")
            session.published_version += 1
            if a.memory_read is not None:
                session.memory_read = a.memory_read
            return {
                "session": session.id, "transaction": txn.name, "state": "published",
                "memory_read": session.memory_read, "commits": sum(c.status == APPLIED for c in txn.commits),
            }

        return self._plan(a, session.id, (fx.PublishCandidate(session.id, transaction=txn.name),), apply)

    def _memory_read(self, a: MemoryRead, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "memory_read")

        def apply(results, now):
            session.memory_read = a.enabled
            return {"session": session.id, "memory_read": a.enabled}

        return self._plan(a, session.id, (), apply)

    def _encoding(self, encoding: str) -> None:
        if encoding != self.limits.native_encoding:
            raise InvalidRequest(f"'encoding' {encoding!r} does not match this server's native encoding {self.limits.native_encoding!r}")

    def _export(self, a: Export, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "export")
        self._encoding(a.encoding)
        if a.transaction is not None:
            open_transaction(session, a.transaction)
            require_certain(session)
        if a.file is not None:
            check_snapshot_name(a.file)

        def apply(results, now):
            return {"session": session.id, "file": results[0], "transaction": a.transaction, "encoding": a.encoding}

        return self._plan(a, session.id, (fx.ExportSnapshot(session.id, transaction=a.transaction, file=a.file, overwrite=a.overwrite),), apply)

    def _import(self, a: Import, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "import")
        require_certain(session)
        self._encoding(a.encoding)
        txn = open_transaction(session, a.transaction)
        check_snapshot_name(a.file)

        def apply(results, now):
            txn.imported = a.file
            return {"session": session.id, "transaction": txn.name, "file": a.file, "state": "open"}

        return self._plan(a, session.id, (fx.ImportSnapshot(session.id, transaction=txn.name, file=a.file),), apply)

    def _inspect(self, a: Inspect, now: float) -> Plan:
        session = self.sessions.get(a.session)
        if session is None:
            raise UnknownSession(f"session {a.session!r} does not exist")
        body = self.describe(session, now)
        return self._plan(a, session.id, (), lambda results, now: body, reserved=False)

    def describe(self, session: Session, now: float) -> dict:
        lease = session.lease
        return {
            "session": session.id,
            "memory_read": session.memory_read,
            "retain_kv": session.retain_kv,
            "leased": bool(lease and lease.valid(now)),
            "lease_expires_in": max(0.0, round(lease.expires_at - now, 3)) if lease else None,
            "transaction": session.transaction.name if session.transaction else None,
            "published_version": session.published_version,
            "uncertain": session.uncertain,
            "in_flight": sorted(session.in_flight),
            "busy": session.reserved,
            "reads": self.read_history(session.id),
        }

    def read_history(self, session: str) -> list[dict]:
        """What the session's latest queries read, oldest first: "what did the model know when it said that?"."""
        return list(self.reads.get(session, ()))

    def _status(self, a: Status, now: float) -> Plan:
        session = self._leased(a, now, allow_expired=True)
        body = {
            "session": session.id,
            "transaction": session.transaction.name if session.transaction else None,
            "uncertain": session.uncertain,
            "published_version": session.published_version,
            "in_flight": sorted(session.in_flight),
            "receipts": {name: txn.to_wire() for name, txn in session.history.items()},
            "reads": self.read_history(session.id),
        }
        return self._plan(a, session.id, (), lambda results, now: body, reserved=False)

    def _recover(self, a: Recover, now: float) -> Plan:
        session = self._leased(a, now, allow_expired=True)
        require_idle(session, "recover")
        txn = session.transaction
        effects = (fx.ReconcileCommits(session.id, transaction=txn.name),) if (txn and session.uncertain) else ()

        def apply(results, now):
            if effects:
                landed = set(results[0])
                for receipt in txn.commits:
                    if receipt.status in (UNKNOWN, PENDING):
                        receipt.status = APPLIED if receipt.nonce in landed else FAILED
            elif session.uncertain:
                # the uncertain work belonged to a transaction that no longer exists: nothing of it can publish
                for old in session.history.values():
                    for receipt in old.commits:
                        if receipt.status in (UNKNOWN, PENDING):
                            receipt.status = FAILED
            session.uncertain = False
            session.lease.expires_at = now + a.ttl
            return {
                "session": session.id, "lease": session.lease.token, "ttl": a.ttl, "recovered": True,
                "transaction": txn.to_wire() if txn else None,
            }

        return self._plan(a, session.id, effects, apply)

    def _cancel(self, a: Cancel, now: float) -> Plan:
        session = self._leased(a, now)
        target = session.in_flight.get(a.request_id)
        if target is None:
            return self._plan(a, session.id, (), lambda results, now: {"session": session.id, "request_id": a.request_id, "cancelled": False}, reserved=False)
        if target != "query":
            raise InvalidRequest(f"request {a.request_id!r} is a commit; only queries can be cancelled")
        return self._plan(
            a, session.id, (fx.CancelRequest(session.id, rid=a.request_id),),
            lambda results, now: {"session": session.id, "request_id": a.request_id, "cancelled": bool(results[0])},
            reserved=False,
        )

    def _kv_reset(self, a: KvReset, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "kv_reset")
        if not session.retain_kv:
            raise InvalidRequest(f"session {session.id!r} was not created with retain_kv")
        return self._plan(a, session.id, (fx.DropRetainedKV(session.id),), lambda results, now: {"session": session.id, "kv_reset": True})

    def _reset(self, a: Reset, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "reset")
        txn = session.transaction
        effects = ((fx.DropCandidate(session.id, transaction=txn.name),) if txn else ()) + (fx.ClearMemory(session.id),)

        def apply(results, now):
            if txn is not None:
                self._archive(session, txn, "aborted")
            session.published_version += 1
            return {"session": session.id, "reset": True, "aborted_transaction": txn.name if txn else None}

        return self._plan(a, session.id, effects, apply)

    def _close(self, a: Close, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "close")

        def apply(results, now):
            del self.sessions[session.id]
            self.reads.pop(session.id, None)
            return {"session": session.id, "closed": True}

        return self._plan(a, session.id, (fx.DropSession(session.id),), apply)

    def _unload(self, a: Unload, now: float) -> Plan:
        session = self._leased(a, now)
        require_idle(session, "unload")
        require_certain(session)
        if not self.limits.durable:
            raise InvalidRequest("unload needs a snapshot store (--snapshot-store): without one it would lose the session's memory")
        if session.transaction is not None:
            raise TransactionConflict(f"session {session.id!r} has open transaction {session.transaction.name!r}; publish or abort it first")
        return self._unload_plan(a, session)

    def _delete_snapshot(self, a: DeleteSnapshot, now: float) -> Plan:
        self._leased(a, now)
        check_snapshot_name(a.file)

        def apply(results, now):
            return {"file": a.file, "deleted": bool(results[0])}

        return self._plan(a, "", (fx.DeleteSnapshot(file=a.file, session=""),), apply, reserved=False)

    def _unload_plan(self, action: Action, session: Session) -> Plan:
        def apply(results, now):
            del self.sessions[session.id]
            self.reads.pop(session.id, None)
            return {"session": session.id, "unloaded": True, "published_version": session.published_version}

        return self._plan(action, session.id, (fx.UnloadSession(session.id),), apply)

    # ------------------------------------------------------------------ generation requests

    def _admit(self, session_name: str, lease: str, epoch: str | None, nonce: str, now: float) -> Session:
        self._check_epoch(epoch)
        session = self._session(session_name)
        if session.lease is None or not _same_token(session.lease.token, lease):
            raise LeaseConflict(f"the lease is not valid for session {session_name!r} (missing, wrong, or released)")
        if not session.lease.valid(now):
            raise LeaseConflict(f"the lease on session {session_name!r} expired; acquire a new one")
        if nonce in session.nonces:
            raise NonceReused(f"nonce {nonce!r} was already used on session {session_name!r}; use a new nonce per request")
        require_idle(session, "a new request")
        return session

    def start_query(self, query: Query, now: float) -> Ticket:
        session = self._admit(query.rid.session, query.lease, query.epoch, query.rid.nonce, now)
        if query.session_params is not None and not session.retain_kv:
            raise InvalidRequest("session_params need a session created with retain_kv")
        session.nonces.add(query.rid.nonce)
        session.in_flight[query.rid.text] = "query"
        return Ticket(session.id, query.rid.text, "query", memory_read=session.memory_read, retain_kv=session.retain_kv,
                      nonce=query.rid.nonce, memory_version=session.published_version)

    def finish_query(self, ticket: Ticket, now: float, *, read: dict | None = None) -> None:
        """The query ended; ``read`` (tokens, finish reason, wall time) goes into the session's read history."""
        session = self.sessions.get(ticket.session)
        if session is None or session.in_flight.pop(ticket.rid, None) is None:
            return
        entry = {"request_id": ticket.rid, "memory_read": ticket.memory_read,
                 "memory_version": ticket.memory_version if ticket.memory_read else None, **(read or {})}
        log = self.reads.get(session.id)
        if log is None:
            log = self.reads[session.id] = deque(maxlen=self.limits.reads_kept)
        log.append(entry)
        self.reads.move_to_end(session.id)
        while len(self.reads) > self.limits.read_histories:
            self.reads.popitem(last=False)

    def start_commit(self, commit: Commit, now: float) -> Ticket:
        session = self._admit(commit.rid.session, commit.lease, commit.epoch, commit.rid.nonce, now)
        require_certain(session)
        txn = open_transaction(session, commit.transaction)
        if self.inflight_commits >= self.limits.max_inflight_commits:
            raise CapacityExceeded(
                f"in-flight commit capacity reached ({self.limits.max_inflight_commits} per rank); retry later"
            )
        session.nonces.add(commit.rid.nonce)
        session.in_flight[commit.rid.text] = "commit"
        txn.commits.append(CommitReceipt(commit.rid.nonce, len(commit.input_ids)))
        self.inflight_commits += 1
        return Ticket(session.id, commit.rid.text, "commit", transaction=txn.name, nonce=commit.rid.nonce)

    def finish_commit(self, ticket: Ticket, outcome: str, now: float) -> None:
        """Record the commit's outcome: ``applied``, ``failed`` or ``unknown`` (which makes the session uncertain)."""
        if outcome not in (APPLIED, FAILED, UNKNOWN):
            raise ValueError(outcome)
        session = self.sessions.get(ticket.session)
        if session is None or session.in_flight.pop(ticket.rid, None) is None:
            return  # already finished: a second report changes nothing
        self.inflight_commits -= 1
        txn = session.history.get(ticket.transaction)
        for receipt in txn.commits if txn else ():
            if receipt.nonce == ticket.nonce:
                receipt.status = outcome
        if outcome == UNKNOWN:
            session.uncertain = True

    # ------------------------------------------------------------------ housekeeping

    def reap(self, now: float) -> list[fx.Effect]:
        """Abandon transactions whose lease expired; returns the candidates the engine may free. The expired
        lease itself stays, so its holder is told "expired" (and may still read status or release) whether or
        not the reaper has run; any client may acquire the session anew."""
        freed = []
        for session in self.sessions.values():
            lease, txn = session.lease, session.transaction
            if txn and lease and not lease.valid(now) and not session.in_flight and session.reserved is None and not session.uncertain:
                self._archive(session, txn, "abandoned")
                session.lapsed = txn.name
                freed.append(fx.DropCandidate(session.id, transaction=txn.name))
        return freed

    def idle_unloads(self, now: float) -> list[Plan]:
        """Plans that unload the sessions left without a valid lease for ``limits.unload_idle`` seconds (with a
        snapshot store only): their memory stays durable and their ownership goes, so the server a router now
        sends them to can take them over. Run them like control plans (``complete``, or ``abandon`` on failure)."""
        if not self.limits.durable or self.limits.unload_idle is None:
            return []
        plans = []
        for session in list(self.sessions.values()):
            free = (session.lease is None or not session.lease.valid(now)) and not session.in_flight
            free = free and session.transaction is None and session.reserved is None and not session.uncertain
            if not free:
                session.free_since = None
                continue
            if session.free_since is None:
                session.free_since = now
            elif now - session.free_since >= self.limits.unload_idle:
                plan = self._unload_plan(Unload(session=session.id, lease=None, epoch=self.epoch), session)
                session.reserved = "unload"
                plans.append(plan)
        return plans

    def room_unload(self, now: float) -> Plan | None:
        """With every slot taken: a plan that unloads the session given up longest ago (its lease released or lapsed;
        one never leased may be its creator's next step) and doing nothing, so a new one fits. With a snapshot store
        any such session (its memory stays in the store; a later create under its name restores it); without one only
        a session whose memory is still empty (never published to, not a copy, no retained context): nothing is lost,
        so a client that made it and went away (a proxy killed before its first commit) never holds the slot for
        good. ``None`` when no session is free."""
        if len(self.sessions) + len(self._creating) < self.limits.max_sessions:
            return None
        free = [
            s for s in self.sessions.values()
            if s.lease_ended(now) is not None and not s.in_flight and s.transaction is None and s.reserved is None
            and not s.uncertain and (self.limits.durable or s.published_version == 0 and not s.copied and not s.retain_kv)
        ]
        if not free:
            return None
        session = min(free, key=lambda s: s.lease_ended(now))
        plan = self._unload_plan(Unload(session=session.id, lease=None, epoch=self.epoch), session)
        session.reserved = "unload"
        return plan

    def counts(self, now: float) -> dict[str, int]:
        """Gauges for metrics."""
        return {
            "sessions": len(self.sessions),
            "leases": sum(1 for s in self.sessions.values() if s.lease and s.lease.valid(now)),
            "open_transactions": sum(1 for s in self.sessions.values() if s.transaction),
            "inflight_commits": self.inflight_commits,
            "uncertain_sessions": sum(1 for s in self.sessions.values() if s.uncertain),
        }
