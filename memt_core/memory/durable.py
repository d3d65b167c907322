"""Durable published memory: every published version of a session, in a store several servers share.

A ``SnapshotStore`` keeps, per session, its latest published version: the snapshot bytes under their
content name and a small manifest that names them. ``DirectorySnapshotStore`` is the first backend (a
directory, e.g. on a shared filesystem)::

    blobs/sha256-<hex>.safetensors      canonical memt-memory-v1 files, named by content
    sessions/<session>.json             {"session", "version", "file", "identity", "fence"}

Writes are atomic (temporary file, fsync, rename), the blob before the manifest that names it, so a
reader sees either the previous version or the new one, never a partial one. Loading checks the
identity and the content hash. With session ownership (``memt_core.memory.ownership``) every write
carries the owner's fencing token; a write or forget with a token older than the manifest's is refused,
so an owner that lost its lease cannot overwrite its successor. The interface is four calls, so an
object store (with conditional writes) can follow.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from memt_core.errors import OwnershipConflict, SnapshotError
from memt_core.memory.snapshot import content_name, load_snapshot, snapshot_bytes, write_atomic
from memt_core.memory.state import MemoryState
from memt_core.names import check_name


@dataclass(frozen=True)
class StoredVersion:
    """A session's latest published version in the store."""

    session: str
    version: int
    file: str  # content name of the snapshot
    fence: int | None = None  # the fencing token of the owner that wrote it


class SnapshotStore(abc.ABC):
    """Where published memory outlives a server."""

    @abc.abstractmethod
    def latest(self, session: str) -> StoredVersion | None:
        """The session's latest stored version, or None."""

    @abc.abstractmethod
    def save(self, session: str, version: int, state: MemoryState, *, fence: int | None = None) -> StoredVersion:
        """Store ``state`` as the session's published ``version`` (refusing to go back in versions or fences)."""

    @abc.abstractmethod
    def load(self, stored: StoredVersion) -> MemoryState:
        """The memory of a stored version, checked (identity, layers, shape, content hash)."""

    @abc.abstractmethod
    def forget(self, session: str, *, fence: int | None = None) -> None:
        """Drop the session (it was closed): a later session of that name starts empty."""


class DirectorySnapshotStore(SnapshotStore):
    """A ``SnapshotStore`` in a directory (local or shared)."""

    def __init__(self, root: str | Path, *, identity: str, layers: Sequence[int], shape: Sequence[int]):
        self.root = Path(root)
        self.identity, self.layers, self.shape = identity, tuple(layers), tuple(shape)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "sessions").mkdir(parents=True, exist_ok=True)

    def _manifest(self, session: str) -> Path:
        check_name(session, "session")
        return self.root / "sessions" / f"{session}.json"

    def latest(self, session: str) -> StoredVersion | None:
        path = self._manifest(session)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise SnapshotError(f"the snapshot store's manifest for {session!r} is unreadable: {exc}") from None
        if record.get("identity") != self.identity:
            raise SnapshotError(f"the stored memory of {session!r} was made for another model/tokenizer identity")
        return StoredVersion(session=session, version=int(record["version"]), file=str(record["file"]), fence=record.get("fence"))

    @staticmethod
    def _check_fence(current: StoredVersion | None, fence: int | None) -> None:
        if current is not None and current.fence is not None and fence is not None and fence < current.fence:
            raise OwnershipConflict(
                f"session {current.session!r} was written by a newer owner (fencing token {current.fence}); this "
                f"server's ownership (token {fence}) is stale and its write is refused"
            )

    def save(self, session: str, version: int, state: MemoryState, *, fence: int | None = None) -> StoredVersion:
        current = self.latest(session)
        self._check_fence(current, fence)
        if current is not None and current.version >= version:
            raise SnapshotError(
                f"the snapshot store already holds version {current.version} of {session!r}; refusing to write version {version} over it"
            )
        data = snapshot_bytes(state, identity=self.identity)
        blob = self.root / "blobs" / content_name(data)
        # written even when another session's equal memory is there already (the same bytes, atomically): how long a
        # publish takes never tells a session that another one, of any tenant, holds this memory
        write_atomic(blob, data, overwrite=True)
        record = {"session": session, "version": version, "file": blob.name, "identity": self.identity, "fence": fence}
        write_atomic(self._manifest(session), json.dumps(record, sort_keys=True).encode(), overwrite=True)
        return StoredVersion(session=session, version=version, file=blob.name, fence=fence)

    def load(self, stored: StoredVersion) -> MemoryState:
        return load_snapshot(self.root / "blobs" / stored.file, identity=self.identity, layers=self.layers, shape=self.shape)

    def forget(self, session: str, *, fence: int | None = None) -> None:
        self._check_fence(self.latest(session), fence)
        try:
            self._manifest(session).unlink()
        except FileNotFoundError:
            pass

