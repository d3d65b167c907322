"""DP attention's bookkeeping on rank 0: which rank holds each handle, and one step record split into one per rank.

With ``--enable-dp-attention`` every rank runs attention and latent memory for its own sessions, whole (attention
TP 1): a memory state, a request's KV cache and a session's retained KV live on exactly one rank. The scheduler does
not know this; it writes one step record as on one device (``memt_core.engine.step``), and ``Owners`` splits it by
where each handle lives, then merges the ranks' results back into one.

Where a handle goes:

- a state put in place (a new session's memory, an import, a durable version) goes to the rank holding the fewest
  handles (the least loaded); a fork stays beside its source;
- a prefill runs where its retained KV is, else where its memory is, else on the least loaded rank; when its memory
  and its retained KV are on two ranks (a session whose first state was put on another rank than its first query
  ran), the memory moves to the KV (``moves``: a copy of one state, made before the step);
- a request's KV stays where it was prefilled, and retained, where it was; a commit writes where its memory is;
- a freed handle, a request that left and the memory it read are forgotten.

Pure: no torch, no collective; ``split`` returns the parts and the moves, ``merge`` one ``StepResult``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from memt_core.engine.step import Commit, Decode, Leave, Prefill, Step, StepResult


@dataclass(frozen=True)
class Move:
    """Copy memory ``handle`` from rank ``source`` to rank ``target`` (and let it go there)."""

    handle: int
    source: int
    target: int


class Owners:
    """Which rank holds each handle; safe to use from the event loop (puts, forks) and the engine's thread (steps)."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self._of: dict[int, int] = {}
        self._reads: dict[int, int] = {}  # running request → the memory handle it reads (let go when it leaves)
        self._load = [0] * ranks
        self.prefills = [0] * ranks  # requests each rank has run
        self._lock = threading.Lock()

    def of(self, handle: int) -> int | None:
        with self._lock:
            return self._of.get(handle)

    def load(self) -> list[int]:
        """Handles held per rank."""
        with self._lock:
            return list(self._load)

    def place(self, handle: int, near: int | None = None) -> int:
        """Give ``handle`` a rank: beside handle ``near`` where it has one, else the least loaded; returns the rank."""
        with self._lock:
            rank = self._of.get(near) if near is not None else None
            return self._bind(handle, self._least() if rank is None else rank)

    def _least(self) -> int:
        return min(range(self.ranks), key=lambda rank: (self._load[rank], rank))

    def _bind(self, handle: int, rank: int) -> int:
        self._forget(handle)
        self._of[handle] = rank
        self._load[rank] += 1
        return rank

    def _forget(self, handle: int | None) -> None:
        rank = self._of.pop(handle, None) if handle is not None else None
        if rank is not None:
            self._load[rank] -= 1

    def split(self, step: Step) -> tuple[tuple[Step, ...], tuple[Move, ...]]:
        """One step record per rank, and the moves to make before it runs."""
        with self._lock:
            leave: list[list[Leave]] = [[] for _ in range(self.ranks)]
            commits: list[list[Commit]] = [[] for _ in range(self.ranks)]
            decode: list[list[Decode]] = [[] for _ in range(self.ranks)]
            prefills: list[list[Prefill]] = [[] for _ in range(self.ranks)]
            free: list[list[int]] = [[] for _ in range(self.ranks)]
            moves = []
            for row in step.leave:
                rank = self._of.get(row.request, 0)
                leave[rank].append(row)
                self._forget(row.request)
                self._forget(self._reads.pop(row.request, None))
                if row.retain is not None:
                    self._bind(row.retain, rank)
            for commit in step.commits:
                commits[self._of.get(commit.memory, 0)].append(commit)
            for row in step.decode:
                decode[self._of.get(row.request, 0)].append(row)
            for prefill in step.prefills:
                rank = self._of.get(prefill.retained) if prefill.retained is not None else None
                held = self._of.get(prefill.memory) if prefill.memory is not None else None
                if rank is None:
                    rank = self._least() if held is None else held
                elif held is not None and held != rank:
                    moves.append(Move(prefill.memory, held, rank))
                    self._bind(prefill.memory, rank)
                self._forget(prefill.retained)  # the request owns that KV from now on
                self._bind(prefill.request, rank)
                if prefill.memory is not None:
                    self._reads[prefill.request] = prefill.memory
                prefills[rank].append(prefill)
                self.prefills[rank] += 1
            for handle in step.free:
                rank = self._of.get(handle)
                for target in range(self.ranks) if rank is None else (rank,):  # unknown: every rank drops what it has
                    free[target].append(handle)
                self._forget(handle)
            parts = tuple(Step(leave=tuple(leave[r]), commits=tuple(commits[r]), decode=tuple(decode[r]),
                               prefills=tuple(prefills[r]), free=tuple(free[r])) for r in range(self.ranks))
            return parts, tuple(moves)

    def merge(self, step: Step, parts: tuple[Step, ...], results: list[StepResult]) -> StepResult:
        """The ranks' results as one, commits in ``step``'s order (a rank whose batch failed gives each of its
        commits that error); a prefill that failed lets go of what its request held, as the runner did."""
        merged = StepResult()
        taken = [0] * len(parts)
        for part, result in zip(parts, results):
            merged.decoded.extend(result.decoded)
            merged.prefilled.update(result.prefilled)
        commits = []
        for commit in step.commits:  # each went to one rank, in order
            rank = next(r for r, part in enumerate(parts) if taken[r] < len(part.commits) and part.commits[taken[r]] is commit)
            outcomes = results[rank].commits
            commits.append(outcomes if isinstance(outcomes, Exception) else outcomes[taken[rank]])
            taken[rank] += 1
        merged.commits = commits
        with self._lock:
            for request, logits in merged.prefilled.items():
                if isinstance(logits, Exception):
                    self._forget(request)
                    self._forget(self._reads.pop(request, None))
        return merged
