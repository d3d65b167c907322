"""One iteration of the engine's loop as plain data: what the scheduler decided and every model runner executes.

The scheduler (``memt_core.engine.torch_engine``, rank 0) holds no device tensor. It names what the model runner
(``memt_core.engine.runner``, every rank) holds by integer handles it allocates itself (``Handles``): a request's
KV cache, a session's retained KV, a memory state. Each loop iteration it writes one ``Step``; the runner runs it
and hands back a ``StepResult`` with the logits the scheduler samples from. The chosen ids ride on the next step
(``Decode.token``), so a step needs nothing from the scheduler while it runs, and one record per iteration is all a
rank must be sent.

A runner executes a step's parts in this order:

1. ``leave``: rows that finished or were cancelled at the last step leave the batch; a row whose session retains
   its native context is kept as the handle ``retain`` first; the request's pinned memory is let go;
2. ``commits``: one batched forward pass and write, each into its memory handle (replaced by the written state);
3. ``decode``: every running row advances one token; rows prefilled at an earlier step join the shared batch
   (those whose caches can be batched, in the order given) before it runs;
4. ``prefills``: new requests' prompts, each owning from now on the memory handle it reads and the retained KV it
   continues (both let go when it leaves);
5. ``free``: memory and KV handles the sessions let go of.

Everything here is frozen, hashable and picklable: ints, tuples and None.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any


class Handles:
    """Integer names for the runner's tensors, never reused; safe to draw from any thread."""

    def __init__(self) -> None:
        self._next = itertools.count(1)
        self._lock = threading.Lock()

    def new(self) -> int:
        with self._lock:
            return next(self._next)


@dataclass(frozen=True)
class Leave:
    request: int
    retain: int | None = None  # keep the row's KV cache under this handle (a retain_kv session's context)


@dataclass(frozen=True)
class Commit:
    memory: int  # the candidate's memory handle; the written state replaces it
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Decode:
    request: int
    token: int  # the id sampled at the last step, fed now
    position: int  # its position: the tokens already cached for the request


@dataclass(frozen=True)
class Prefill:
    request: int
    tokens: tuple[int, ...]  # what is fed: the prompt past the retained context's tokens
    memory: int | None = None  # the pinned memory the request reads (None: no read)
    retained: int | None = None  # retained KV the prompt continues (None: a fresh cache)


@dataclass(frozen=True)
class Step:
    leave: tuple[Leave, ...] = ()
    commits: tuple[Commit, ...] = ()
    decode: tuple[Decode, ...] = ()
    prefills: tuple[Prefill, ...] = ()
    free: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.leave or self.commits or self.decode or self.prefills or self.free)


@dataclass
class CommitOutcome:
    tokens: int
    write_events: int


@dataclass
class Logits:
    """The last position's logits of ``requests``, one row each (``values``: ``[len(requests), vocab]``)."""

    requests: tuple[int, ...]
    values: Any  # torch.Tensor, gathered on rank 0


@dataclass
class StepResult:
    """What rank 0 gets back: per commit its outcome or error (or the one error that failed them all), the decode's logits
    by block (the shared batch, then each row decoded alone), and each prefill's logits or its error."""

    commits: list[CommitOutcome | Exception] | Exception = field(default_factory=list)
    decoded: list[Logits] = field(default_factory=list)
    prefilled: dict[int, Any] = field(default_factory=dict)  # request → logits [vocab] | Exception
