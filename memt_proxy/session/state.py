"""What the proxy knows of each session and the bounded table of them: no I/O, no clock.

Constants of the session layer, the native session ID and snapshot-file mappings (tenant-scoped), a
session's ``SessionState`` and ``PendingTurn``, the ``SessionTable`` (least recently used idle state
dropped to make room), ``MemoryTokens`` (the prompt tokens each session's memory spares) and the three internal signals ``LeaseTaken``, ``NotHeld`` and ``MemoryFound``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator

from memt_core.errors import InvalidRequest
from memt_core.names import check_snapshot_name
from memt_proxy.errors import BadRequest, RateLimited

MAX_SESSIONS = 1024  # default --max-sessions: session states kept in memory
MEMORY_STATES_BUDGET_MIB = 512  # default --memory-states-budget: upstream memory header-less states may hold (MiB)
MAX_MEMORY_STATES = 256  # header-less states kept where no checkpoint sizes them (a Sessions made without a count)
LIVE_SECONDS = 600.0  # a header-less conversation used this recently is live: closing its latest state is logged
LEASE_TTL = 30  # default native lease lifetime (seconds); renewed while the session is active
LEASE_IDLE = 30.0  # default seconds a session's lease is kept after its last request
SHUTDOWN_COMMIT_WAIT = 30.0  # seconds aclose() gives the commits still under way
COMMIT_CAPACITY_WAIT = 30.0  # seconds a commit retries while the upstream's in-flight commit capacity is full (429)
RELEASE_WAIT = 10.0  # seconds a release retries while a cancelled query is still winding down upstream
DEPARTED_WAIT = 10.0  # seconds a session is kept from its next request while a query left early winds down upstream
#: sessions offloaded, at most, to make room for one new native session: requests creating sessions at the
#: same time may each take the slot another one freed, so one request may need several
OFFLOAD_TRIES = 16
SNAPSHOT_NAME_LIMIT = 207  # the native snapshot-name grammar's longest name
KEPT_PREFIX = "~"  # kept states' session names start with it: no X-MemT-Session can


def state_bytes(memory) -> int:
    """What one memory state holds (a ``memt_core.checkpoint.MemoryConfig``): an FP32 ``[H, K, V]`` matrix per memory layer."""
    return len(memory.memory_layers) * memory.num_heads * memory.key_dim * memory.value_dim * 4


def states_within(budget_mib: int, memory) -> int:
    """How many header-less states ``budget_mib`` MiB of the upstream's memory holds (at least one)."""
    return max(1, budget_mib * 2**20 // state_bytes(memory))


def new_kept_name() -> str:
    """A name for a kept state of a conversation (``memt_proxy.session.headerless``): outside the client's name grammar."""
    return KEPT_PREFIX + secrets.token_hex(12)


def native_session_id(tenant: str, session: str) -> str:
    """Tenant-scoped, collision-resistant native session ID within the native grammar."""
    return "p-" + hashlib.sha256(f"{tenant}\x00{session}".encode()).hexdigest()[:40]


OFFLOAD_PREFIX = "o-"  # offload snapshots' names (tenant snapshots start with 't', Responses' with 'r')


def offload_file(native: str) -> str:
    """A new upstream file for offloading ``native``: its own, so deleting it once restored touches no other."""
    return f"{OFFLOAD_PREFIX}{native}-{secrets.token_hex(8)}.safetensors"


def snapshot_file(tenant: str, name: str) -> str:
    """The upstream file of a tenant's snapshot ``name``: ``t<hash of tenant>-<name>``, so names never meet across tenants."""
    try:
        check_snapshot_name(name)
    except InvalidRequest as exc:
        raise BadRequest(exc.message, param="name", code="invalid_snapshot_name") from None
    file = f"t{hashlib.sha256(tenant.encode()).hexdigest()[:16]}-{name}"
    if len(file) > SNAPSHOT_NAME_LIMIT:
        raise BadRequest(f"snapshot names are at most {SNAPSHOT_NAME_LIMIT - len(file) + len(name)} characters here", param="name", code="invalid_snapshot_name")
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
    name: str = ""  # the session's name: a client's X-MemT-Session, or a kept state's (``memt_proxy.session.kept``)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    committed: list[str] = field(default_factory=list)  # hashes of committed messages, in order
    history_known: bool = True  # False when we adopted a native session whose history we never saw
    pending: PendingTurn | None = None
    exists: bool = False
    version: int = 0  # the upstream's published_version of the memory that ``committed`` describes
    lease: str | None = None  # the native lease, kept across requests while the session is active
    keeper: asyncio.Task | None = None  # renews the lease, and releases it once the session is idle
    idle_since: float | None = None  # when the last user let go, on the layer's clock (``Sessions.clock``; None: in use)
    nudge: asyncio.Event = field(default_factory=asyncio.Event)  # wakes the keeper when the session goes idle
    committing: asyncio.Task | None = None  # the commit of the previous turn, while under way
    users: int = 0  # requests holding or waiting for this state, and its commit: while any, it is never dropped
    last_turn: dict | None = None  # the surface's answer to the last committed turn (JSON, with its version), for an identical retry
    origin: str | None = None  # a kept state made before a named session's turn: that session's native id (closed with it)
    extended: bool = False  # a header-less state a later turn was copied from: no longer its conversation's latest

    @contextlib.contextmanager
    def in_use(self) -> Iterator[SessionState]:
        """The state in use for the block (``users``): never dropped from the table, never let go idle, while it lasts.
        A use that outlives its caller's block (a request's, a commit's behind its answer) is the table's ``take``,
        ``hold`` and ``give_back``."""
        self.users += 1
        try:
            yield self
        finally:
            self.users -= 1

    @property
    def is_kept(self) -> bool:
        """A kept state of a conversation (its name is the proxy's, outside the client's grammar)."""
        return self.name.startswith(KEPT_PREFIX)

    @property
    def empty(self) -> bool:
        """The native session's memory is the empty one it was created with (never published to, and no copy)."""
        return self.exists and self.version == 0 and not self.committed

    @property
    def blank(self) -> bool:
        """Nothing is known to be in memory and no turn waits for tool results: what a prompt prepared
        before the native session was created or adopted assumed."""
        return not self.committed and self.history_known and self.pending is None

    # ---- the lifecycle: every change of what the proxy knows of the native session is one of these

    def created(self, committed: list[str] | None = None) -> None:
        """Made upstream: empty, or (``committed``) a copy of a state holding those messages; version 0 until its first write."""
        self.exists, self.version, self.committed, self.history_known = True, 0, list(committed or []), True

    def adopted(self, version: int, committed: list[str] | None) -> None:
        """Found upstream at ``version`` (or restored there from a snapshot); ``committed`` None: what it holds is unknown."""
        self.exists, self.version = True, version
        self.committed, self.history_known = committed or [], committed is not None

    def published(self, committed: list[str]) -> None:
        """A write this proxy recorded was published: memory holds ``committed``; a turn waiting for tool results ended."""
        self.committed, self.version, self.history_known, self.pending = committed, self.version + 1, True, None

    def offloaded(self) -> None:
        """Exported to a snapshot and closed upstream: what it held stays known, to be restored at version 0."""
        self.exists, self.version = False, 0

    def let_go(self) -> None:
        """No longer held upstream (unloaded, or changed by someone else): its next use brings it back or adopts it."""
        self.exists = False

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


class MemoryTokens:
    """How many prompt tokens each session's memory holds, as written by this proxy (one count for every surface): per native session,
    ``(messages in memory, tokens written)``; a count is trusted only while the session's memory still
    holds that many messages (an adopted, reset or failed-commit session counts 0 until written again)."""

    LIMIT = 100_000  # sessions remembered (oldest forgotten first)

    def __init__(self):
        self._written: dict[str, tuple[int, int]] = {}

    def held(self, state: SessionState | None) -> int:
        if state is None:
            return 0
        messages, tokens = self._written.get(state.native, (None, 0))
        return tokens if messages == len(state.committed) and state.committed else 0

    def wrote(self, state: SessionState, messages: int, tokens: int) -> None:
        """A commit of ``tokens`` is on its way; memory will then hold ``messages`` messages."""
        total = self.held(state) + tokens
        self._written.pop(state.native, None)  # re-inserted last: the most recently written are kept longest
        self._written[state.native] = (messages, total)
        while len(self._written) > self.LIMIT:
            self._written.pop(next(iter(self._written)))

    def copied(self, state: SessionState, source: SessionState) -> None:
        """``state``'s memory was made a copy of ``source``'s: it holds what that held."""
        tokens = self.held(source)
        if tokens:
            self._written[state.native] = (len(source.committed), tokens)


@dataclass
class Later:
    """A write left for after the request (``HeldSession.commit_turn_later``): ``commits`` (one transaction), after which
    memory holds ``committed``. ``keep_parent``: what memory held before is kept as a state of its own first (a named
    chat session's fork point); ``source``: memory is first made a copy of that kept state (a fork from it)."""

    commits: list[list[int]]
    committed: list[str]
    keep_parent: bool = False
    source: str | None = None


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

    def room(self) -> int:
        """States the table can still take without refusing a request: free places and idle states."""
        return self.capacity - len(self._states) + sum(state.users == 0 for state in self._states.values())

    def take(self, tenant: str, session: str) -> SessionState:
        """``entry``, marked in use until ``give_back``."""
        state = self.entry(tenant, session)
        state.users += 1
        return state

    def hold(self, state: SessionState) -> None:
        """One more use of a state already taken (its commit behind the answer, in a task of its own), until ``give_back``."""
        state.users += 1

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
            if state.lease is not None or state.is_kept and state.exists:  # a kept state's native session is closed with it
                self.evicted.append(state)
            return
        raise RateLimited(
            f"the proxy is serving {self.capacity} sessions at once (--max-sessions); retry when one finishes",
            code="too_many_sessions",
        )


def evicted_first(states) -> list[SessionState]:
    """``states`` (least recently used first) in the order room is made: header-less states a later turn extended (kept
    for a regenerate or an edit), then the rest, each part least recently used first: a live conversation keeps its
    latest state while any other's older one can go."""
    return sorted(states, key=lambda state: not (state.is_kept and state.extended))


class LeaseTaken(Exception):
    """Another client holds the session's lease (``Leases.acquire(wait=False)``); handled here, never answered."""


class NotHeld(Exception):
    """The upstream no longer holds a session this proxy made (``Leases.acquire``; it let an idle one go, or unloaded
    it): ``Placement.acquire`` brings it back once; ``error`` is what is answered if it cannot."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class MemoryFound(Exception):
    """``HeldSession.query``, creating a session beside its answer, adopted one that holds memory: the prompt,
    prepared for an empty one, must be prepared again (the lease is taken by then); never answered."""
