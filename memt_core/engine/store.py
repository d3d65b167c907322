"""The engine's side of sessions: published memory, transaction candidates, retained KV, snapshots.

``MemoryStore.apply`` carries out the protocol's effects (``memt_core.protocol.effects``). Memory
tensors are never changed in place, so a query that captured a session's published memory keeps
reading exactly that memory whatever happens afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from memt_core.errors import BadGeneration, InvalidRequest
from memt_core.memory.durable import SnapshotStore
from memt_core.memory.ownership import Owned
from memt_core.memory.snapshot import CONTENT_NAME, load_snapshot, remove_partials, save_content_addressed, save_snapshot, snapshot_path
from memt_core.memory.state import MemoryState
from memt_core.protocol import effects as fx


@dataclass
class Candidate:
    """A transaction's memory under construction and the commit nonces folded into it."""

    memory: MemoryState
    applied: list[str] = field(default_factory=list)


@dataclass
class RetainedKV:
    """Native context kept after a query of a ``retain_kv`` session."""

    cache: Any  # the backbone's cache object, batch size 1
    tokens: tuple[int, ...]  # tokens whose keys/values the cache holds
    acknowledged: tuple[int, ...]  # tokens + the last generated token: what the next query must extend
    memory_version: int
    memory_read: bool


@dataclass
class SessionMemory:
    published: MemoryState = field(default_factory=MemoryState)
    version: int = 0
    candidates: dict[str, Candidate] = field(default_factory=dict)
    retained: RetainedKV | None = None


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
        self, *, identity: str, layers: tuple[int, ...], shape: tuple[int, ...], device, state_directory: str | Path | None,
        durable: SnapshotStore | None = None,
        owned: Owned | None = None,
    ):
        self.identity = identity
        self.layers = layers
        self.shape = shape
        self.device = device
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
        memory = self.durable.load(stored).to(self.device)
        self.sessions[e.session] = SessionMemory(published=memory, version=stored.version)
        return stored.version

    def _copy_memory(self, e: fx.CopyMemory) -> None:
        copied = self.get(e.source).published.fork()
        if self.durable is not None:  # the copy replaces whatever an older session of that name left
            self._own(e.session)
            self.durable.forget(e.session, fence=self._fence(e.session))
            self.durable.save(e.session, 0, copied, fence=self._fence(e.session))
        self.sessions[e.session] = SessionMemory(published=copied)

    def _fork_candidate(self, e: fx.ForkCandidate) -> None:
        memory = self.get(e.session)
        memory.candidates[e.transaction] = Candidate(memory.published.fork())

    def _drop_candidate(self, e: fx.DropCandidate) -> None:
        self.get(e.session).candidates.pop(e.transaction, None)

    def _publish_candidate(self, e: fx.PublishCandidate) -> None:
        memory = self.get(e.session)
        candidate = self.candidate(e.session, e.transaction).memory
        if self.durable is not None:  # durable first: a failed write leaves the session as it was
            self.durable.save(e.session, memory.version + 1, candidate, fence=self._fence(e.session))
        memory.published = candidate
        memory.version += 1
        del memory.candidates[e.transaction]

    def _import_snapshot(self, e: fx.ImportSnapshot) -> None:
        path = snapshot_path(self.state_directory, e.file)
        state = load_snapshot(path, identity=self.identity, layers=self.layers, shape=self.shape).to(self.device)
        self.candidate(e.session, e.transaction).memory = state

    def _export_snapshot(self, e: fx.ExportSnapshot) -> str:
        memory = self.get(e.session)
        state = memory.published if e.transaction is None else self.candidate(e.session, e.transaction).memory
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
        memory.published = MemoryState()
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
        self.sessions.pop(session, None)
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
        self.get(e.session).retained = None

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
