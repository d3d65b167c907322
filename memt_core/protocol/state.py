"""The protocol's state: sessions with their lease, transactions and receipts; limits; plans and tickets.

Plain data, no rules: ``memt_core.protocol.machine`` (with the per-session ``guards``) decides every change.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from memt_core.protocol import effects as fx
from memt_core.protocol.events import Action, action_name

APPLIED, FAILED, UNKNOWN, PENDING = "applied", "failed", "unknown", "pending"


def _same_token(expected: str, given: str | None) -> bool:
    """Constant-time token comparison; any client string (non-ASCII included) is simply unequal."""
    return hmac.compare_digest(expected.encode(), (given or "").encode())


@dataclass(frozen=True)
class Limits:
    """Capacity and features of this server."""

    max_sessions: int = 1
    max_inflight_commits: int = 1
    retain_kv_enabled: bool = False
    native_encoding: str = "hf-chat-template"
    receipts_kept: int = 32  # finished transactions remembered per session for status/recover
    reads_kept: int = 16  # finished queries remembered per session (its read history)
    read_histories: int = 1024  # sessions whose read history is kept, least recently read dropped first
    durable: bool = False  # published memory is kept in a snapshot store (unload is possible)
    unload_idle: float | None = None  # seconds without a lease after which a session is unloaded (durable only)


@dataclass
class Lease:
    token: str
    expires_at: float

    def valid(self, now: float) -> bool:
        return now < self.expires_at


@dataclass
class CommitReceipt:
    nonce: str
    tokens: int
    status: str = PENDING  # pending | applied | failed | unknown


@dataclass
class Transaction:
    name: str
    state: str = "open"  # open | published | aborted | abandoned
    commits: list[CommitReceipt] = field(default_factory=list)
    imported: str | None = None

    def to_wire(self) -> dict:
        return {
            "transaction": self.name,
            "state": self.state,
            "imported": self.imported,
            "commits": [{"nonce": c.nonce, "tokens": c.tokens, "status": c.status} for c in self.commits],
        }


@dataclass
class Session:
    id: str
    memory_read: bool = True
    retain_kv: bool = False
    lease: Lease | None = None
    transaction: Transaction | None = None  # the open one
    history: "OrderedDict[str, Transaction]" = field(default_factory=OrderedDict)
    nonces: set[str] = field(default_factory=set)
    in_flight: dict[str, str] = field(default_factory=dict)  # rid → "query" | "commit"
    reserved: str | None = None  # control action being carried out
    uncertain: bool = False
    published_version: int = 0
    free_since: float | None = None  # when it was last seen without a valid lease (idle unloading)
    lapsed: str | None = None  # transaction the reaper abandoned under the current lease, until the lease ends
    released_at: float | None = None  # when its last lease was released (making room unloads the longest idle)
    copied: bool = False  # created as a copy of another session's memory (it holds memory at version 0)

    def lease_ended(self, now: float) -> float | None:
        """When the session was last given up: its lease released or lapsed; ``None`` while leased or never leased."""
        if self.lease is not None:
            return self.lease.expires_at if not self.lease.valid(now) else None
        return self.released_at


@dataclass
class Plan:
    """A checked control action: the engine effects to run, then ``complete`` applies it."""

    action: Action
    session: str
    effects: tuple[fx.Effect, ...]
    apply: Callable[[list[Any], float], dict] = field(repr=False)
    reserved: bool = True

    @property
    def name(self) -> str:
        return action_name(self.action)


@dataclass(frozen=True)
class Ticket:
    """An admitted generation request."""

    session: str
    rid: str
    kind: str  # "query" | "commit"
    memory_read: bool = True
    retain_kv: bool = False
    transaction: str | None = None
    nonce: str | None = None
    memory_version: int = 0  # the published version a query reads
