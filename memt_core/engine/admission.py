"""Admission against the KV budget (``--max-total-tokens``) and the queue's bound (``--max-queued-requests``).

A query reserves, when it is admitted, the KV tokens it may come to hold: its prompt and ``max_new_tokens``, at most
the whole budget. It is admitted only while the reservations of the running queries and its own fit in the budget;
otherwise it waits, first in line (the queue stays in order). Retained contexts (``retain_kv`` sessions) count
against the same budget and are evicted first: a query that does not fit frees them before it waits. One that would outgrow the whole budget alone runs
alone and stops when it reaches it (finish reason "length"), so the cache never holds more than the budget. Queries
waiting for admission (accepted, not yet running) are counted; beyond ``max_queued`` a new one is refused with
``EngineBusy`` (503, ``Retry-After``).

``padded``: the running queries' caches are one left-padded batch (the growing cache, ``memt_core.engine.kv``), so
each row takes the longest row's length: what they hold together is their count × the largest reservation, and a
query is admitted against that. In a paged pool (``padded=False``) each holds only its own, in whole blocks
(``block``), and the sum counts.

Pure bookkeeping, shared by the event loop (``enter``) and the engine's thread (the rest): one lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from memt_core.errors import EngineBusy, InvalidRequest


@dataclass
class Admission:
    budget: int | None = None  # KV tokens the running queries may hold together (None: no bound)
    max_queued: int | None = None  # queries that may wait (None: no bound)
    reserved: int = 0  # what the running queries reserved
    peak: int = 0  # the most ever held at once: reservations and retained contexts
    queued: int = 0  # accepted, not yet admitted nor ended
    refused: int = 0  # refused because the queue was full
    padded: bool = False  # the running queries share one left-padded cache: count × the largest reservation
    block: int = 1  # a paged pool's block: a reservation is whole blocks

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._running: list[int] = []  # the running queries' reservations

    def _held(self, extra: int = 0) -> int:
        """What the running queries (and one more reserving ``extra``) may come to hold together."""
        if not self.padded:
            return self.reserved + extra
        count = len(self._running) + (1 if extra else 0)
        return count * max(self._running + [extra], default=0)

    def enter(self, prompt_tokens: int) -> None:
        """A query arrives: refused (400) when its prompt alone fills the budget, (503) when the queue is full."""
        if self.budget is not None and prompt_tokens >= self.budget:
            raise InvalidRequest(f"a prompt of {prompt_tokens} tokens leaves no room to generate within the server's KV "
                                 f"budget of {self.budget} tokens (--max-total-tokens)")
        with self._lock:
            if self.max_queued is not None and self.queued >= self.max_queued:
                self.refused += 1
                raise EngineBusy(f"{self.queued} queries are waiting for admission (--max-queued-requests {self.max_queued}): "
                                 "retry after a moment")
            self.queued += 1

    def left_queue(self) -> None:
        with self._lock:
            self.queued -= 1

    def need(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """The tokens a query reserves (0 without a budget)."""
        if self.budget is None:
            return 0
        return min(-(-(prompt_tokens + max_new_tokens) // self.block) * self.block, self.budget)

    def room(self, need: int, retained: int = 0) -> int:
        """Tokens missing for a query reserving ``need`` beside the running ones and ``retained`` tokens of retained
        contexts (0: it fits; always 0 without a budget)."""
        with self._lock:
            return 0 if self.budget is None else max(0, self._held(need) + retained - self.budget)

    def fits(self, need: int, alone: bool, retained: int = 0) -> bool:
        """Whether a query reserving ``need`` may start now (``alone``: nothing else runs or starts this step)."""
        return alone or self.room(need, retained) == 0

    def admit(self, need: int, retained: int = 0) -> None:
        with self._lock:
            self.reserved += need
            self._running.append(need)
            self.peak = max(self.peak, self._held() + retained)

    def release(self, need: int) -> None:
        with self._lock:
            if need in self._running:
                self._running.remove(need)
            self.reserved -= need

    def describe(self) -> dict:
        with self._lock:
            return {"kv_budget_tokens": self.budget, "kv_reserved_tokens": self.reserved, "kv_reserved_peak": self.peak,
                    "queued": self.queued, "max_queued": self.max_queued, "refused_queue_full": self.refused}
