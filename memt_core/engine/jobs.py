"""The scheduler's jobs: one query (its prompt, sampler, output, and the handles of what the model runner holds for
it) or one commit, and the calls that hand results from the worker thread back to the asyncio side. No tensor
rides on a job."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from memt_core.engine.base import TokenEvent
from memt_core.engine.store import RetainedKV
from memt_core.sampling import Sampler, SamplingParams


@dataclass(eq=False)
class QueryJob:
    rid: str
    handle: int  # names the request's KV cache in the runner
    prompt: list[int]
    memory: int | None  # handle of the memory it reads, pinned at admission (None: no read)
    params: SamplingParams
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    session: str | None = None
    retain: bool = False  # keep native context afterwards (retain_kv session)
    retained: RetainedKV | None = None  # context handed over from the previous query
    memory_version: int = 0
    memory_read: bool = True
    cancelled: bool = False
    incremental: bool = True  # False: events after the first are held and sent with the last (one wake-up)
    held: list[TokenEvent] = field(default_factory=list)
    sampler: Sampler | None = None
    output: list[int] = field(default_factory=list)
    fed: int = 0  # tokens whose keys/values are cached
    reserved: int = 0  # KV tokens reserved against --max-total-tokens while it runs (memt_core.engine.admission)

    @property
    def last(self) -> int:
        return self.output[-1]


@dataclass(eq=False)
class CommitJob:
    session: str
    transaction: str
    nonce: str
    ids: list[int]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


def put_all(queue: asyncio.Queue, events: list[TokenEvent]) -> None:
    for event in events:
        queue.put_nowait(event)


def set_result(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
