"""The engine's side of sessions: published memory, transaction candidates, retained KV, snapshots.

``MemoryStore.apply`` carries out the protocol's effects (``memt_core.protocol.effects``). It holds no tensor:
memory states and retained KV caches live in the model runner (``memt_core.engine.runner``), named here by
handles (``memt_core.engine.step.Handles``); ``None`` names the empty memory. The store forks, loads and reads
states through a ``MemoryTable`` (the runner, or on several ranks the call that reaches every runner) and hands
the handles it lets go to ``release`` (freed at the engine's next step, after whatever that step still reads). A
fork shares its states' tensors, which are never changed in place, so a query that pinned a session's published
memory keeps reading exactly that memory whatever happens afterwards.
"""

from __future__ import annotations

import threading

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

from memt_core.errors import BadGeneration, InvalidRequest
from memt_core.memory.durable import SnapshotStore
from memt_core.memory.ownership import Owned
from memt_core.memory.snapshot import CONTENT_NAME, load_snapshot, remove_partials, save_content_addressed, save_snapshot, snapshot_path
from memt_core.memory.state import MemoryState
from memt_core.protocol import effects as fx


class MemoryTable(Protocol):
    """Where the memory states are (the model runner): put, fork and read by handle."""

    def put_memory(self, handle: int, state: MemoryState) -> None: ...

    def fork_memory(self, source: int, handle: int) -> None: ...

    def memory(self, handle: int | None) -> MemoryState: ...


@dataclass
class Candidate:
    """A transaction's memory under construction (a handle; None: empty) and the commit nonces folded into it."""

    memory: int
    applied: list[str] = field(default_factory=list)


@dataclass
class RetainedKV:
    """Native context kept after a query of a ``retain_kv`` session: its KV cache is the runner's ``kv``."""

    kv: int  # handle of the backbone's cache, batch size 1
    tokens: tuple[int, ...]  # tokens whose keys/values the cache holds
    acknowledged: tuple[int, ...]  # tokens + the last generated token: what the next query must extend
    memory_version: int
    memory_read: bool


@dataclass
class SessionMemory:
    published: int | None = None  # handle of the published memory; None: empty
    version: int = 0
    candidates: dict[str, Candidate] = field(default_factory=dict)
    retained: RetainedKV | None = None

    def handles(self) -> list[int]:
        """Every runner handle the session holds."""
        held = [self.published] + [c.memory for c in self.candidates.values()]
        held += [self.retained.kv] if self.retained is not None else []
        return [h for h in held if h is not None]


class MemoryStore:
    """All sessions' memory on this engine, the snapshot directory, and (optionally) the durable store.

    With a ``SnapshotStore`` every change of published memory (publish, reset) is written to it before
    it takes effect here, and a new session whose name the store knows starts from its latest version.
    With ``Owned`` sessions, creating one acquires it (409 if another server owns it) and every durable
    write carries its fencing token.
    """

    def _fence(self, session: str) -> int | None:
        return self.owned.token(session) if self.owned is not None else None

    def _own(self, session: str) -> None:
        if self.owned is not None:
            self.owned.acquire(session)

    def renew_ownership(self) -> list[str]:
        """Renew the leases of owned sessions that are due; returns those that were lost."""
        return self.owned.renew_due() if self.owned is not None else []

    def __init__(
        self, *, identity: str, layers: tuple[int, ...], shape: tuple[int, ...], table: MemoryTable, handles,
        release: Callable[[int], None], state_directory: str | Path | None,
        durable: SnapshotStore | None = None,
        owned: Owned | None = None,
    ):
        self.identity = identity
        self.layers = layers
        self.shape = shape
        self.table = table
        self.handles = handles  # memt_core.engine.step.Handles, shared with the scheduler
        self.release = release
        self._retained_lock = threading.Lock()  # retained contexts are kept and evicted by the engine's thread, taken by the loop's
        self.state_directory = Path(state_directory) if state_directory else None
        self.sessions: dict[str, SessionMemory] = {}
        self.durable = durable
        self.owned = owned  # with several servers on one store: the sessions this one owns, with fencing tokens
        if self.state_directory is not None:
            self.state_directory.mkdir(parents=True, exist_ok=True)
            remove_partials(self.state_directory)

    def get(self, session: str) -> SessionMemory:
        try:
            return self.sessions[session]
        except KeyError:
            raise BadGeneration(f"the engine has no memory for session {session!r}") from None

    # ------------------------------------------------------------------ handles

    def _fork(self, source: int | None) -> int | None:
        if source is None:
            return None
        handle = self.handles.new()
        self.table.fork_memory(source, handle)
        return handle

    def _put(self, state: MemoryState) -> int:
        handle = self.handles.new()
        self.table.put_memory(handle, state)
        return handle

    def _let_go_of(self, *handles: int | None) -> None:
        for handle in handles:
            if handle is not None:
                self.release(handle)

    def pin(self, session: str) -> int | None:
        """A handle of the session's published memory as it is now, for a query to read (it lets go of it)."""
        return self._fork(self.get(session).published)

    def state(self, handle: int | None) -> MemoryState:
        """The memory a handle names (on several ranks, gathered), for snapshots and the durable store."""
        return self.table.memory(handle)

    def take_retained(self, state: SessionMemory) -> RetainedKV | None:
        with self._retained_lock:
            retained, state.retained = state.retained, None
        return retained

    def check_prompt(self, session: str, prompt: list[int]) -> None:
        """Refuse a query that does not extend the session's retained context (before anything is admitted)."""
        state = self.sessions.get(session)
        retained = state.retained if state is not None else None
        if retained is None:
            return
        n = len(retained.acknowledged)
        if len(prompt) <= len(retained.tokens) or tuple(prompt[:n]) != retained.acknowledged:
            raise InvalidRequest(
                f"this session retains native context: the query must extend the acknowledged prefix of {n} tokens "
                "exactly (or call kv_reset first)"
            )

    def retained_tokens(self) -> int:
        """Tokens every session's retained context holds in the KV cache."""
        with self._retained_lock:
            return sum(len(m.retained.tokens) for m in list(self.sessions.values()) if m.retained is not None)

    def evict_retained(self, tokens: int) -> int:
        """Let go of retained contexts, largest first, until ``tokens`` are freed (or none is left); returns the tokens
        freed. Their sessions' next queries are prefilled whole."""
        freed = 0
        with self._retained_lock:
            held = sorted((m for m in list(self.sessions.values()) if m.retained is not None), key=lambda m: -len(m.retained.tokens))
            for memory in held:
                if freed >= tokens:
                    break
                freed += len(memory.retained.tokens)
                self._let_go_of(memory.retained.kv)
                memory.retained = None
        return freed

    def retain(self, session: str, retained: RetainedKV) -> bool:
        """Keep a finished query's context for the session's next query; False (nothing kept) if it is gone."""
        state = self.sessions.get(session)
        if state is None:
            return False
        with self._retained_lock:
            if state.retained is not None:
                self._let_go_of(state.retained.kv)
            state.retained = retained
        return True

    # ------------------------------------------------------------------ effects

    def candidate(self, session: str, transaction: str) -> Candidate:
        try:
            return self.get(session).candidates[transaction]
        except KeyError:
            raise BadGeneration(f"the engine has no candidate for transaction {transaction!r} of {session!r}") from None

    def apply(self, effect: fx.Effect) -> Any:
        """Carry out one effect; returns what the protocol needs back (file name, nonces, …)."""
        handler = self.HANDLERS.get(type(effect))
        if handler is None:
            raise TypeError(f"the memory store does not carry out {type(effect).__name__} effects")
        return handler(self, effect)

    def _new_memory(self, e: fx.NewMemory) -> int:
        """Empty memory, or the session's latest durable version; returns that version (0: new)."""
        self._own(e.session)
        stored = self.durable.latest(e.session) if self.durable is not None else None
        if stored is None:
            self.sessions[e.session] = SessionMemory()
            return 0
        self._let_go_of(*(self.sessions[e.session].handles() if e.session in self.sessions else ()))
        self.sessions[e.session] = SessionMemory(published=self._put(self.durable.load(stored)), version=stored.version)
        return stored.version

    def _copy_memory(self, e: fx.CopyMemory) -> None:
        source = self.get(e.source).published
        if self.durable is not None:  # the copy replaces whatever an older session of that name left
            self._own(e.session)
            self.durable.forget(e.session, fence=self._fence(e.session))
            self.durable.save(e.session, 0, self.state(source), fence=self._fence(e.session))
        if e.session in self.sessions:
            self._let_go_of(*self.sessions[e.session].handles())
        self.sessions[e.session] = SessionMemory(published=self._fork(source))

    def _fork_candidate(self, e: fx.ForkCandidate) -> None:
        memory = self.get(e.session)
        if e.transaction in memory.candidates:
            self._let_go_of(memory.candidates[e.transaction].memory)
        # a candidate always has a handle of its own: a commit writes the state it makes there
        fork = self._fork(memory.published) if memory.published is not None else self._put(MemoryState())
        memory.candidates[e.transaction] = Candidate(fork)

    def _drop_candidate(self, e: fx.DropCandidate) -> None:
        dropped = self.get(e.session).candidates.pop(e.transaction, None)
        if dropped is not None:
            self._let_go_of(dropped.memory)

    def _publish_candidate(self, e: fx.PublishCandidate) -> None:
        memory = self.get(e.session)
        candidate = self.candidate(e.session, e.transaction).memory
        if self.durable is not None:  # durable first: a failed write leaves the session as it was
            self.durable.save(e.session, memory.version + 1, self.state(candidate), fence=self._fence(e.session))
        self._let_go_of(memory.published)
        memory.published = candidate
        memory.version += 1
        del memory.candidates[e.transaction]

    def _import_snapshot(self, e: fx.ImportSnapshot) -> None:
        path = snapshot_path(self.state_directory, e.file)
        state = load_snapshot(path, identity=self.identity, layers=self.layers, shape=self.shape)
        candidate = self.candidate(e.session, e.transaction)
        self._let_go_of(candidate.memory)
        candidate.memory = self._put(state)

    def _export_snapshot(self, e: fx.ExportSnapshot) -> str:
        memory = self.get(e.session)
        state = self.state(memory.published if e.transaction is None else self.candidate(e.session, e.transaction).memory)
        if e.file is None and self.state_directory is not None:
            # the server picks the name: the content's hash, so equal memories share one file
            return save_content_addressed(self.state_directory, state, identity=self.identity).name
        path = snapshot_path(self.state_directory, e.file)  # no state directory: InvalidRequest
        save_snapshot(path, state, identity=self.identity, overwrite=e.overwrite)
        return e.file

    def _clear_memory(self, e: fx.ClearMemory) -> None:
        memory = self.get(e.session)
        if self.durable is not None:  # a reset is a published version too, or a restore would bring the memory back
            self.durable.save(e.session, memory.version + 1, MemoryState(), fence=self._fence(e.session))
        self._let_go_of(memory.published, memory.retained.kv if memory.retained is not None else None)
        memory.published = None
        memory.version += 1
        memory.retained = None

    def _drop_session(self, e: fx.DropSession) -> None:
        if self.durable is not None:
            self.durable.forget(e.session, fence=self._fence(e.session))
        self._let_go(e.session)

    def _unload_session(self, e: fx.UnloadSession) -> None:
        self._let_go(e.session)  # the durable store keeps its versions: another server restores them

    def _let_go(self, session: str) -> None:
        """Free the session here and give up its ownership."""
        gone = self.sessions.pop(session, None)
        if gone is not None:
            self._let_go_of(*gone.handles())
        if self.owned is not None:
            self.owned.release(session)

    def _delete_snapshot(self, e: fx.DeleteSnapshot) -> bool:
        path = snapshot_path(self.state_directory, e.file)  # no state directory: InvalidRequest
        if CONTENT_NAME.match(e.file):
            raise InvalidRequest(f"snapshot {e.file!r} is content-addressed: such files are immutable and may be shared by many sessions, so they are never deleted")
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _drop_retained_kv(self, e: fx.DropRetainedKV) -> None:
        memory = self.get(e.session)
        if memory.retained is not None:
            self._let_go_of(memory.retained.kv)
        memory.retained = None

    def _reconcile_commits(self, e: fx.ReconcileCommits) -> list[str]:
        candidate = self.get(e.session).candidates.get(e.transaction)
        return list(candidate.applied) if candidate else []

    #: The handler of each memory effect, one table built with the class (``apply`` dispatches on it).
    HANDLERS: ClassVar[dict[type[fx.Effect], Callable[[MemoryStore, Any], Any]]] = {
        fx.NewMemory: _new_memory,
        fx.CopyMemory: _copy_memory,
        fx.ForkCandidate: _fork_candidate,
        fx.DropCandidate: _drop_candidate,
        fx.PublishCandidate: _publish_candidate,
        fx.ImportSnapshot: _import_snapshot,
        fx.ExportSnapshot: _export_snapshot,
        fx.ClearMemory: _clear_memory,
        fx.DropSession: _drop_session,
        fx.UnloadSession: _unload_session,
        fx.DeleteSnapshot: _delete_snapshot,
        fx.DropRetainedKV: _drop_retained_kv,
        fx.ReconcileCommits: _reconcile_commits,
    }


#: Effects the engine carries out itself, not the store: stopping a query touches no memory.
ENGINE_EFFECTS = frozenset({fx.CancelRequest})

_unhandled = set(fx.Effect.__subclasses__()) - set(MemoryStore.HANDLERS) - ENGINE_EFFECTS
if _unhandled:  # a new effect without a handler fails on import, not on its first use
    raise TypeError(f"MemoryStore has no handler for {', '.join(sorted(e.__name__ for e in _unhandled))}")


def shared_stores(checkpoint, options) -> tuple:
    """``--snapshot-store``'s durable store and ``--ownership``'s owner of sessions, each None when not asked for."""
    durable = owned = None
    if options.snapshot_store:
        from memt_core.memory.durable import DirectorySnapshotStore

        memory = checkpoint.memory
        durable = DirectorySnapshotStore(options.snapshot_store, identity=checkpoint.identity(),
                                         layers=memory.memory_layers, shape=memory.state_shape())
    if options.ownership:
        from memt_core.memory.ownership import Owned, RedisOwnership

        owned = Owned(RedisOwnership(options.ownership, owner=options.node_id or "memt", ttl=options.ownership_ttl))
    return durable, owned
