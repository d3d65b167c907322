"""The engine interface: what the native server needs from whatever runs the model.

The server (service, routes, metrics) and the launcher know only ``Engine``; an implementation owns
model execution and the session memory tensors. The protocol decides what is legal and names the
memory work as effects (``memt_core.protocol.effects``); the engine carries them out. Engines are
chosen by name (``--engine``) from ``memt_core.engine.ENGINES``.

This module imports no torch, so the launcher can validate options before loading anything.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, ClassVar

from memt_core.engine.budget import Budget
from memt_core.parallel.plan import Parallel

if TYPE_CHECKING:
    from memt_core.checkpoint import Checkpoint
    from memt_core.protocol import effects as fx
    from memt_core.sampling import SamplingParams


@dataclass
class TokenEvent:
    """One generated token, or the end of a request (``finish_reason`` set, ``token`` possibly None)."""

    token: int | None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    matched_stop: int | None = None
    error: Exception | None = None  # a MemTError when the request failed
    logprob: float | None = None  # of ``token``, when the request asked for log-probabilities
    top_logprobs: list[tuple[int, float]] | None = None  # (token id, log-probability), most likely first


@dataclass
class CommitInfo:
    """What one commit wrote: its tokens and the write events they formed."""

    tokens: int
    write_events: int


@dataclass
class EngineStats:
    """Counters the server exports as metrics."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    commit_tokens: int = 0
    commits: int = 0
    write_events: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    running: int = 0
    waiting: int = 0
    queued: int = 0  # queries accepted and not yet admitted (the inbox and the waiting queue)
    kv_reserved: int = 0  # KV tokens the running queries reserved against --max-total-tokens
    kv_reserved_peak: int = 0
    kv_held_peak: int | None = None  # the most KV tokens the caches held after a step, measured (None: on other ranks)
    kv_budget: int | None = None  # --max-total-tokens (None: no bound)
    refused_queue_full: int = 0  # queries refused with 503 beyond --max-queued-requests


@dataclass(frozen=True)
class EngineOptions:
    """Everything the launcher decided that an engine may take; each engine checks what applies to it."""

    device: str = "cpu"
    dtype: str = "float32"
    max_running_requests: int = 32
    max_commit_batch: int = 1
    context_length: int = 32768
    min_kv_tokens: int = 1
    max_sessions: int = 1  # sessions per rank (memt_runtime.max_sessions_per_rank): the memory state slots sized at start
    enable_streaming_session: bool = False
    torch_compile: bool = False  # compile the decode step and short prefills with torch.compile (engines that can)
    threads: int | None = None  # CPU threads of torch's intra-op pool (None: the engine's choice)
    fused_decode: bool = True  # the decode step in fewer kernel launches where the model's family has one
    cuda_graphs: bool = False  # replay the decode step from CUDA graphs (engines that can, on a GPU)
    cuda_graph_max_tokens: int = 4096  # the longest batch context the graphs hold (longer: eager steps)
    warmup: str = "auto"  # run the served shapes before reporting ready: "auto" (on a GPU), "on", "off"
    warmup_lengths: tuple[int, ...] | None = None  # prompt and commit lengths warmed up (None: the engine's buckets)
    warmup_batch_sizes: tuple[int, ...] | None = None  # decode batch sizes warmed up (None: powers of two)
    deterministic_communication: bool = False  # all-reduces sum the ranks' parts in rank order (multi-rank engines)
    parallel: Parallel = Parallel()  # ranks and how the model is split over them (memt_core.parallel)
    budget: Budget = Budget()  # the memory budget, the queue's bound and the backends (memt_core.engine.budget)
    state_directory: str | None = None
    snapshot_store: str | None = None  # a directory every published version is written to (shared by servers)
    ownership: str | None = None  # URL of the coordination service for one owner per session (redis://…)
    ownership_ttl: float = 30.0  # seconds a session lease lasts unless renewed
    node_id: str | None = None  # this server's name as an owner
    extra: dict = field(default_factory=dict)  # engine-specific settings, refused by engines that take none


class Engine(abc.ABC):
    """Queries, commits and memory effects for every session of one model.

    Lifecycle: ``check_options`` (class-level, before loading) → ``load`` → ``start`` → … → ``stop``.
    All methods but ``start``/``stop`` are called from the server's event loop; ``apply`` and
    ``commit`` may do blocking work only off that loop.
    """

    #: the ``--engine`` name
    name: ClassVar[str]

    # ------------------------------------------------------------------ construction

    @classmethod
    @abc.abstractmethod
    def check_options(cls, options: EngineOptions) -> None:
        """Refuse options this engine cannot honour (``CheckpointError`` naming the flag); loads nothing."""

    @classmethod
    @abc.abstractmethod
    def load(cls, checkpoint: "Checkpoint", options: EngineOptions) -> "Engine":
        """Load the checkpoint's model and return a ready (not yet started) engine."""

    @classmethod
    def settings(cls, options: EngineOptions) -> dict:
        """The settings this engine will run with, as ``--dry-run`` prints them."""
        return {"engine": cls.name}

    # ------------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    def start(self) -> "Engine":
        """Start executing work (worker threads, device streams)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop executing work; in-flight requests fail."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether the engine can take work (the server's /health)."""

    @property
    def ready(self) -> bool:
        """Whether the engine has finished warming up (``/health`` answers 503 "warming up" until then); work sent
        before waits for it."""
        return True

    def warmup_progress(self) -> dict:
        """What the warm-up has done so far, for ``/health`` while it runs."""
        return {}

    # ------------------------------------------------------------------ identity

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Token ids must be below this."""

    @property
    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Current counters (read at scrape time)."""

    def identity(self) -> dict:
        """The engine's part of ``/memt/identity``."""
        from memt_core import __version__

        return {"engine": f"memt-{self.name}", "engine_version": __version__}

    def capabilities(self) -> dict:
        """The engine's part of ``/memt/capabilities`` (beyond what the protocol states)."""
        return {}

    async def housekeeping(self) -> None:
        """Periodic upkeep the server calls every few seconds (e.g. renewing session ownership)."""

    # ------------------------------------------------------------------ memory

    @abc.abstractmethod
    async def apply(self, effect: "fx.Effect") -> Any:
        """Carry out one protocol effect (new/copy/fork/publish/import/export/clear/drop, cancel, reconcile)."""

    @abc.abstractmethod
    async def commit(self, session: str, transaction: str, nonce: str, ids: list[int]) -> CommitInfo:
        """Fold ``ids`` into the transaction's candidate; resolves when the candidate holds them."""

    @abc.abstractmethod
    def committed(self, session: str, transaction: str, nonce: str) -> bool:
        """Whether the commit with ``nonce`` reached the transaction's candidate (after an error)."""

    # ------------------------------------------------------------------ generation

    @abc.abstractmethod
    def check_prompt(self, session: str, prompt: list[int]) -> None:
        """Refuse a query the engine cannot run for this session, before anything is admitted."""

    @abc.abstractmethod
    def query(
        self,
        rid: str,
        prompt: list[int],
        params: "SamplingParams",
        *,
        session: str | None = None,
        memory_read: bool = True,
        retain: bool = False,
        incremental: bool = True,
    ) -> AsyncIterator[TokenEvent]:
        """Start generating; an async iterator of token events ending with a finish (or error) event.

        Reads the session's published memory as it is now (none when ``memory_read`` is off or
        ``session`` is None). Leaving the iterator early cancels the work. ``incremental=False`` says the
        consumer acts only on the first event and the whole result (no stream, no stop strings): the
        events in between may then arrive all at once, with the last.
        """

    @abc.abstractmethod
    def cancel(self, rid: str) -> bool:
        """Stop a running query; its iterator ends with finish_reason "abort". False if unknown."""

