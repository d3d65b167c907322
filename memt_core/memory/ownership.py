"""One owner per session across servers: a lease with a fencing token in a coordination service.

Servers that share a snapshot store must never both write one session (split brain after a network
partition or a routing change). A server *acquires* a session before serving it: the service grants
a lease for ``ttl`` seconds and a *fencing token* that only ever grows. Every write to the snapshot
store carries the token, and the store refuses a write whose token is older than one it has already
seen, so an owner whose lease lapsed (paused, partitioned) can never overwrite its successor's
versions, even if it does not know yet that it lost the lease.

``RedisOwnership`` keeps the lease as ``SET key value NX PX ttl`` and the token as ``INCR``; renew and
release are compare-and-set scripts, so a server only ever extends or drops its own lease.
"""

from __future__ import annotations

import abc
import time

from memt_core.errors import OwnershipConflict


class Ownership(abc.ABC):
    """Leases on sessions for one server (``owner``)."""

    owner: str
    ttl: float

    @abc.abstractmethod
    def acquire(self, session: str) -> int:
        """Own ``session`` (or keep owning it); returns a fencing token. ``OwnershipConflict`` if another owns it."""

    @abc.abstractmethod
    def renew(self, session: str, token: int) -> bool:
        """Extend this server's lease; False when it was lost (expired, taken by another)."""

    @abc.abstractmethod
    def release(self, session: str, token: int) -> None:
        """Give the session up (only this server's own lease is removed)."""


_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisOwnership(Ownership):
    """Session leases in Redis: ``memt:owner:<session>`` = ``<owner> <token>``, tokens from ``memt:fence:<session>``."""

    def __init__(self, url: str, *, owner: str, ttl: float = 30.0, prefix: str = "memt"):
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.owner, self.ttl, self.prefix = owner, ttl, prefix
        self._renew = self.client.register_script(_RENEW)
        self._release = self.client.register_script(_RELEASE)

    def _keys(self, session: str) -> tuple[str, str]:
        return f"{self.prefix}:owner:{session}", f"{self.prefix}:fence:{session}"

    def acquire(self, session: str) -> int:
        lease, fence = self._keys(session)
        token = int(self.client.incr(fence))
        if self.client.set(lease, f"{self.owner} {token}", nx=True, px=int(self.ttl * 1000)):
            return token
        holder = (self.client.get(lease) or b"").decode()
        if holder.split(" ", 1)[0] == self.owner:  # already ours (a session re-created here): take the new token
            if self.client.set(lease, f"{self.owner} {token}", xx=True, px=int(self.ttl * 1000)):
                return token
        remaining = self.client.pttl(lease)
        raise OwnershipConflict(
            f"session {session!r} is owned by another server ({holder.split(' ', 1)[0] or 'unknown'}) for "
            f"{max(remaining, 0) / 1000:.1f} more seconds; route the session to its owner or retry later"
        )

    def renew(self, session: str, token: int) -> bool:
        lease, _ = self._keys(session)
        return bool(self._renew(keys=[lease], args=[f"{self.owner} {token}", int(self.ttl * 1000)]))

    def release(self, session: str, token: int) -> None:
        lease, _ = self._keys(session)
        self._release(keys=[lease], args=[f"{self.owner} {token}"])


class Owned:
    """The sessions this server owns and their tokens; renews them when their lease is half spent."""

    def __init__(self, ownership: Ownership, clock=time.monotonic):
        self.ownership, self.clock = ownership, clock
        self.tokens: dict[str, tuple[int, float]] = {}  # session → (token, when last renewed)

    def acquire(self, session: str) -> int:
        token = self.ownership.acquire(session)
        self.tokens[session] = (token, self.clock())
        return token

    def token(self, session: str) -> int | None:
        entry = self.tokens.get(session)
        return entry[0] if entry else None

    def release(self, session: str) -> None:
        entry = self.tokens.pop(session, None)
        if entry is not None:
            self.ownership.release(session, entry[0])

    def renew_due(self) -> list[str]:
        """Renew leases past half their time; returns the sessions whose lease was lost."""
        lost, now = [], self.clock()
        for session, (token, renewed) in list(self.tokens.items()):
            if now - renewed < self.ownership.ttl / 2:
                continue
            if self.ownership.renew(session, token):
                self.tokens[session] = (token, now)
            else:
                lost.append(session)
        return lost
