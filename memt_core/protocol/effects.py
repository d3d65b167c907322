"""Engine work that a planned control action needs before its state change can be applied.

The protocol never touches memory tensors; it names the work as one of these frozen records and the
server hands them to the engine. ``ReconcileCommits`` answers with the nonces the engine applied;
``ExportSnapshot`` with the file name written; ``CancelRequest`` with whether a request was stopped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Effect:
    session: str


@dataclass(frozen=True)
class NewMemory(Effect):
    """Create empty memory for a new session."""


@dataclass(frozen=True)
class CopyMemory(Effect):
    """Create a session's memory as a copy of ``source``'s published memory."""

    source: str


@dataclass(frozen=True)
class ForkCandidate(Effect):
    """Start a transaction's candidate from the published memory."""

    transaction: str


@dataclass(frozen=True)
class DropCandidate(Effect):
    """Discard a transaction's candidate (abort, abandoned lease, release)."""

    transaction: str


@dataclass(frozen=True)
class PublishCandidate(Effect):
    """Make a transaction's candidate the published memory."""

    transaction: str


@dataclass(frozen=True)
class ImportSnapshot(Effect):
    """Replace a transaction's candidate with a checked snapshot file."""

    transaction: str
    file: str


@dataclass(frozen=True)
class ExportSnapshot(Effect):
    """Write published memory (or a transaction's candidate) to a snapshot file; ``file=None`` picks a new name."""

    transaction: str | None
    file: str | None
    overwrite: bool


@dataclass(frozen=True)
class ClearMemory(Effect):
    """Reset published memory to empty."""


@dataclass(frozen=True)
class DropSession(Effect):
    """Free everything the engine holds for the session."""


@dataclass(frozen=True)
class UnloadSession(Effect):
    """Free the session's memory here and give up its ownership; its durable versions stay in the store."""


@dataclass(frozen=True)
class DeleteSnapshot(Effect):
    """Delete a named snapshot file; answers whether there was one. ``session`` is empty: files are the server's."""

    file: str


@dataclass(frozen=True)
class DropRetainedKV(Effect):
    """Forget the session's retained native KV context."""


@dataclass(frozen=True)
class CancelRequest(Effect):
    """Stop the in-flight query with this RID."""

    rid: str


@dataclass(frozen=True)
class ReconcileCommits(Effect):
    """Ask which commit nonces of ``transaction`` actually landed in its candidate."""

    transaction: str
