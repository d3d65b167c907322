"""The steps of one memory write, written once and without I/O: begin → commit each piece →
[import | export] → publish, and what to do when a step fails.

Rules of this file (as in ``memt_core.protocol``):

* No I/O: no HTTP, no asyncio, no clock. Time arrives as ``now``; the transaction name and the commit
  nonces come from the caller. The blocking ``MemTSession`` and the asyncio proxy drive the same plan;
  each maps a step to its request and an error to ``failed(...)``.
* A driver asks ``next_step(now)``, carries the step out in the session's lease, and reports
  ``succeeded(result)`` or ``failed(...)``; ``next_step`` answers ``None`` once there is an ``outcome``.
* A step refused for capacity (429: nothing applied) is retried, after a ``WaitStep``, for up to
  ``capacity_wait`` seconds from the first refusal (``None``: never). A step that failed with certainty
  abandons the write: with ``abort_on_failure`` the open transaction is aborted first, otherwise the
  caller's release of the lease abandons it upstream. A step whose outcome is uncertain (sent, no
  answer) is never replayed: the plan ends ``uncertain`` and ``resume(receipt)`` continues from the
  server's commit receipts, resending only the commits that did not land.

Outcomes: ``published``, ``abandoned``, ``uncertain``; after ``resume``, ``aborted`` (an import that did
not land), or the receipt's own state when nothing was left to do (``unknown`` without a receipt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

CAPACITY_RETRY_FIRST = 0.02  # seconds before the first retry of a step refused for capacity; doubled each time
CAPACITY_RETRY_MOST = 0.5


@dataclass(frozen=True)
class BeginStep:
    transaction: str
    stage = "begin"


@dataclass(frozen=True)
class CommitStep:
    """Write ``ids`` (piece ``index`` of the plan) into the transaction, once, under ``nonce``."""

    transaction: str
    ids: list[int]
    index: int
    nonce: str
    stage = "commit"


@dataclass(frozen=True)
class ImportStep:
    transaction: str
    file: str
    stage = "import"


@dataclass(frozen=True)
class ExportStep:
    """Export the transaction's candidate memory (what publish will make current)."""

    transaction: str
    file: str | None
    overwrite: bool
    stage = "export"


@dataclass(frozen=True)
class PublishStep:
    transaction: str
    memory_read: bool | None
    stage = "publish"


@dataclass(frozen=True)
class AbortStep:
    transaction: str
    stage = "abort"


@dataclass(frozen=True)
class WaitStep:
    """Sleep, then ask for the next step (a retry)."""

    seconds: float
    stage = "wait"


Step = BeginStep | CommitStep | ImportStep | ExportStep | PublishStep | AbortStep


class MemoryWrite:
    """One transaction's plan: ``pieces`` committed in order, or a snapshot ``import_file``, then publish."""

    def __init__(
        self,
        transaction: str,
        pieces: Sequence[Sequence[int]] = (),
        *,
        new_nonce: Callable[[], str],
        import_file: str | None = None,
        export: tuple[str | None, bool] | None = None,  # (file, overwrite) of an export before publish
        memory_read: bool | None = None,  # publish also sets the session's memory_read
        capacity_wait: float | None = None,
        abort_on_failure: bool = False,
    ):
        if import_file is not None and pieces:
            raise ValueError("a write either imports a snapshot or commits pieces, not both")
        self.transaction = transaction
        self.pieces = [list(p) for p in pieces]
        self.import_file = import_file
        self.export = export
        self.memory_read = memory_read
        self.capacity_wait = capacity_wait
        self.abort_on_failure = abort_on_failure
        self._new_nonce = new_nonce
        self.outcome: str | None = None
        self.stage = "begin"  # the stage of the latest step: what failed, when something did
        self.attempts: list[tuple[str, int]] = []  # (nonce, piece index) of every commit sent, in order
        self.results: dict[str, Any] = {}  # each step's result by stage (``export``: the file written)
        self.landed: set[str] = set()  # nonces the receipt says landed (after ``resume``)
        self.resent = 0  # commits sent after ``resume``
        self._todo: list[tuple[str, int]] = (
            [("begin", 0)]
            + [("commit", i) for i in range(len(self.pieces))]
            + ([("import", 0)] if import_file is not None else [])
            + ([("export", 0)] if export is not None else [])
            + [("publish", 0)]
        )
        self._sent: Step | None = None
        self._wait: float | None = None
        self._delay = CAPACITY_RETRY_FIRST
        self._retry_until: float | None = None
        self._resumed = False
        self._abort_outcome = "abandoned"

    # ------------------------------------------------------------------ driving

    def next_step(self, now: float = 0.0) -> Step | WaitStep | None:
        """The step to carry out now; ``None`` once the plan has an outcome."""
        if self.outcome is not None:
            return None
        if self._sent is not None:
            raise RuntimeError(f"the outcome of {self._sent.stage} has not been reported")
        if self._wait is not None:
            seconds, self._wait = self._wait, None
            return WaitStep(seconds)
        kind, index = self._todo[0]
        step = self._step(kind, index)
        self._sent, self.stage = step, step.stage
        if isinstance(step, CommitStep):
            self.attempts.append((step.nonce, index))
            if self._resumed:
                self.resent += 1
        return step

    def _step(self, kind: str, index: int) -> Step:
        t = self.transaction
        if kind == "begin":
            return BeginStep(t)
        if kind == "commit":
            return CommitStep(t, self.pieces[index], index, self._new_nonce())
        if kind == "import":
            return ImportStep(t, self.import_file)
        if kind == "export":
            return ExportStep(t, *self.export)
        if kind == "publish":
            return PublishStep(t, self.memory_read)
        return AbortStep(t)

    def succeeded(self, result: Any = None) -> None:
        """The step sent last was carried out; ``result`` is the server's answer."""
        step = self._reported()
        self.results[step.stage] = result
        self._todo.pop(0)
        self._delay, self._retry_until = CAPACITY_RETRY_FIRST, None
        if isinstance(step, PublishStep):
            self.outcome = "published"
        elif isinstance(step, AbortStep):
            self.outcome = self._abort_outcome

    def failed(self, *, uncertain: bool, capacity: bool = False, now: float = 0.0) -> None:
        """The step sent last failed: ``uncertain`` if it may have been applied, ``capacity`` if refused
        for capacity (429, nothing applied)."""
        step = self._reported()
        if uncertain:
            self.outcome = "uncertain"
            return
        if capacity and self.capacity_wait is not None:
            if self._retry_until is None:
                self._retry_until = now + self.capacity_wait
            if now <= self._retry_until:
                self._wait, self._delay = self._delay, min(2 * self._delay, CAPACITY_RETRY_MOST)
                return
        if self.abort_on_failure and not isinstance(step, (BeginStep, PublishStep, AbortStep)):
            self._todo = [("abort", 0)]
            return
        self.outcome = "abandoned"

    def _reported(self) -> Step:
        if self._sent is None:
            raise RuntimeError("no step is waiting for its outcome")
        step, self._sent = self._sent, None
        return step

    # ------------------------------------------------------------------ recovery

    def resume(self, receipt: dict | None) -> None:
        """Continue an ``uncertain`` write from the server's receipt of its transaction (``status`` → ``receipts``).

        An open transaction goes on: an import is published if the receipt shows the file imported (else
        aborted); commits that landed are kept and the rest sent again, then publish. A transaction that
        is no longer open is what the receipt says (``published``, ``aborted``, ``abandoned``; ``unknown``).
        """
        if self.outcome != "uncertain":
            raise RuntimeError("only an uncertain write is resumed")
        state = receipt["state"] if receipt else None
        self.landed = {c["nonce"] for c in receipt["commits"] if c["status"] == "applied"} if receipt else set()
        if state != "open":
            self.outcome = state or "unknown"
            return
        self.outcome, self._resumed, self.resent = None, True, 0
        if self.import_file is not None:
            self._abort_outcome = "aborted"
            self._todo = [("publish", 0)] if receipt.get("imported") == self.import_file else [("abort", 0)]
            return
        done = self.landed_pieces
        self.attempts = [(nonce, index) for nonce, index in self.attempts if index < done and nonce in self.landed]
        self._todo = [("commit", i) for i in range(done, len(self.pieces))] + [("publish", 0)]

    @property
    def landed_pieces(self) -> int:
        """How many leading pieces have a commit the receipt says landed (commits are sent one after another)."""
        landed = {index for nonce, index in self.attempts if nonce in self.landed}
        done = 0
        while done in landed:
            done += 1
        return done
