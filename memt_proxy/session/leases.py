"""Native leases: taken, kept and renewed while a session is active, released once it has been idle
``lease_idle`` seconds, when its state is dropped, or at shutdown.

``Leases`` calls nothing above it: a session the upstream let go is reported (``NotHeld``), and the part that places
sessions brings it back and asks again (``Placement.acquire``)."""

from __future__ import annotations

import asyncio
import logging
from memt_core.client.errors import MemTClientError
from memt_core.errors import (
    Conflict,
    EpochMismatch,
    LeaseConflict,
    SessionBusy,
    UnknownSession,
)
from memt_proxy.session.clock import Clock
from memt_proxy.session.state import RELEASE_WAIT, LeaseTaken, NotHeld, SessionState
from memt_proxy.session.upstream import Upstream

log = logging.getLogger("memt.proxy")


class Leases:
    """Leases kept across requests, on ``upstream``."""

    def __init__(self, upstream: Upstream, *, lease_wait: float, lease_ttl: int, lease_idle: float, clock: Clock | None = None):
        self.upstream = upstream
        self.clock = clock or Clock()  # every wait, renewal and idle time here is on it
        self.client = upstream.client
        self.lease_wait = lease_wait  # seconds a request waits for a lease another client holds
        self.lease_ttl = lease_ttl
        self.lease_idle = lease_idle  # seconds an idle session keeps its lease (0: released after each request)

    async def acquire(self, state: SessionState, *, wait: bool = True) -> str:
        """A new native lease (waiting up to ``lease_wait`` while another client holds it; ``wait=False``: raising
        ``LeaseTaken`` at once), kept as the session's and renewed until released, or until the session has been idle
        for ``lease_idle`` seconds. ``NotHeld`` where the upstream no longer holds a session this proxy made (a server
        with a snapshot store unloads idle ones): ``Placement.acquire`` brings it back."""
        state.drop_lease()
        deadline = self.clock.now() + self.lease_wait
        while True:
            try:
                lease = (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]
                break
            except MemTClientError as exc:
                if isinstance(exc.cause, UnknownSession) and state.exists:
                    raise NotHeld(self.upstream.error(exc)) from None
                if isinstance(exc.cause, LeaseConflict) and not wait:
                    raise LeaseTaken(exc.message) from None
                if not isinstance(exc.cause, LeaseConflict) or self.clock.now() > deadline:
                    raise self.upstream.error(exc) from None
            await self.clock.sleep(0.2)
        state.lease = lease
        state.keeper = asyncio.get_running_loop().create_task(self._keep(state, lease))
        return lease

    async def one_shot(self, state: SessionState) -> str:
        """A lease for one last action on the session (offload, close, unload): its kept lease, no longer kept, or a new one,
        never renewed; the action ends it (or ``release_once``). Raises the client's error: the caller decides."""
        return state.drop_lease() or (await self.client.control("acquire", state.native, ttl=self.lease_ttl))["lease"]

    async def release_once(self, state: SessionState, lease: str) -> None:
        """Release a ``one_shot`` lease whose action did not run, once; raises the client's error."""
        await self.client.control("release", state.native, lease=lease)

    async def _keep(self, state: SessionState, lease: str) -> None:
        """Renew the lease every third of its lifetime while the session is in use or was used within
        ``lease_idle`` seconds, then release it: long generations and active conversations keep it, and a
        proxy that dies leaves its sessions leased for at most ``lease_ttl`` seconds."""
        renew_at = self.clock.now() + self.lease_ttl / 3
        while state.lease == lease:
            now = self.clock.now()
            idle_at = state.idle_since + self.lease_idle if state.idle_since is not None else renew_at
            if state.users == 0 and state.idle_since is not None and now >= idle_at and not state.lock.locked():
                with state.in_use():  # not dropped from the table while it releases
                    async with state.lock:  # free: taken at once; a request arriving now waits for the release
                        if state.lease == lease:
                            state.lease, state.keeper = None, None
                            await self.release(state, lease)
                return
            if now >= renew_at:
                try:
                    await self.client.control("renew", state.native, lease=lease, ttl=self.lease_ttl)
                except MemTClientError as exc:
                    # a bare 409 (a server that does not name the kind) means the same: the lease is no longer usable
                    if not isinstance(exc.cause, (UnknownSession, LeaseConflict, EpochMismatch)) and type(exc.cause) is not Conflict:
                        log.warning("renewing the lease of %s failed (%s); retrying", state.native, exc.message)
                        renew_at = self.clock.now() + 1.0  # e.g. the upstream briefly unreachable: the lease is still ours
                        continue
                    if state.lease == lease:  # the session or the lease is gone: the next request acquires a new one
                        state.lease, state.keeper = None, None
                    return
                renew_at = self.clock.now() + self.lease_ttl / 3
                continue
            state.nudge.clear()
            await self.clock.wait(state.nudge, min(renew_at, idle_at))

    async def release(self, state: SessionState, lease: str, *, at_shutdown: bool = False) -> MemTClientError | None:
        """Release ``lease`` (an open transaction upstream is abandoned with it); stop keeping it if it is the session's.
        A failure is logged in one line; ``at_shutdown``, one where the upstream did not answer is returned instead,
        for the caller to say once for all its sessions (the lease expires upstream within its ttl)."""
        if state.lease == lease:
            state.drop_lease()
        deadline = self.clock.now() + RELEASE_WAIT
        while True:
            try:
                await self.client.control("release", state.native, lease=lease)
                return
            except MemTClientError as exc:
                # after a client disconnect the cancelled upstream query may still be in flight for a moment
                if (isinstance(exc.cause, SessionBusy) or type(exc.cause) is Conflict) and self.clock.now() < deadline:
                    await self.clock.sleep(0.05)
                    continue
                if at_shutdown and exc.cause is None:
                    return exc
                log.warning("release of %s failed: %s", state.native, exc.message)
                return None
