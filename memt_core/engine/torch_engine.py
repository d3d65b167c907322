"""The torch engine: runs many sessions' queries and commits on CPU or one GPU.

One worker thread owns all model execution. Each loop iteration it (1) runs waiting commits, batched;
(2) prefills newly admitted queries one by one; (3) advances every running query by one token in a
single batched decode step (continuous batching: requests join and leave between steps). Each row
of a decode batch reads its own session's memory snapshot, captured when the query was admitted.
Results flow back to the asyncio side through per-request queues and futures.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from typing import Any, AsyncIterator

import torch
from transformers import DynamicCache

from memt_core.checkpoint import Checkpoint
from memt_core.engine import kv, warmup
from memt_core.engine.base import CommitInfo, Engine, EngineOptions, EngineStats, TokenEvent
from memt_core.engine.device import claim_architecture, compile_model, cpu_threads, inductor_options  # noqa: F401 (cpu_threads re-exported)
from memt_core.engine.jobs import CommitJob, QueryJob, put_all, set_exception, set_result
from memt_core.engine.store import MemoryStore, RetainedKV
from memt_core.errors import BadGeneration, CheckpointError, InvalidRequest, MemTError, WorkerUnavailable
from memt_core.models.passes import commit_batch, eos_token_ids, memory_batch
from memt_core.memory.state import MemoryState
from memt_core.models.memt import MemTForCausalLM
from memt_core.protocol import effects as fx
from memt_core.sampling import Sampler, SamplingParams

log = logging.getLogger("memt.engine")

#: With ``--enable-torch-compile``, prompts of ``COMPILED_PREFILL_TOKENS[0]`` to ``[1]`` tokens on a fresh cache are
#: prefilled by the compiled step as well: on the CPU a demo-model prompt of 31 tokens in about half the time, of
#: 200 in 0.85-0.9x, while from several hundred tokens the eager pass is the faster. Shorter prompts are shapes of
#: their own to the compiler, and stay eager.
COMPILED_PREFILL_TOKENS = (3, 256)

#: effects that read or write the durable snapshot store when there is one
DURABLE_EFFECTS = (fx.NewMemory, fx.CopyMemory, fx.PublishCandidate, fx.ClearMemory, fx.DropSession, fx.UnloadSession)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class TorchEngine(Engine):
    """Queries, commits and memory effects for every session of one model, on CPU or one GPU."""

    name = "torch"

    @classmethod
    def check_options(cls, options: EngineOptions) -> None:
        if options.deterministic_communication:
            raise CheckpointError(
                "--deterministic-communication is for multi-device engines; the torch engine runs on one device "
                "and has no collective communication to fix"
            )
        if options.extra:
            raise CheckpointError(f"the torch engine takes no engine-specific settings, got {sorted(options.extra)}")
        if options.ownership and not options.snapshot_store:
            raise CheckpointError("--ownership needs --snapshot-store: ownership fences writes to the shared snapshot store")
        if options.ownership and not options.ownership.startswith(("redis://", "rediss://", "unix://")):
            raise CheckpointError(f"--ownership must be a redis:// URL, got {options.ownership!r}")
        if options.dtype not in DTYPES:
            raise CheckpointError(f"--dtype {options.dtype!r} is not one of {sorted(DTYPES)}")
        if options.cuda_graphs:
            if not str(options.device).startswith("cuda"):
                raise CheckpointError("--enable-cuda-graph needs a CUDA device (--device cuda)")
            if options.torch_compile:
                raise CheckpointError("--enable-cuda-graph replays the eager fused decode step; leave out --enable-torch-compile")
            if not options.fused_decode:
                raise CheckpointError("--enable-cuda-graph replays the fused decode step; leave out --disable-fused-decode")
        if options.cuda_graph_max_tokens < 1:
            raise CheckpointError("--cuda-graph-max-tokens must be at least 1")
        if options.warmup not in warmup.MODES:
            raise CheckpointError(f"--warmup must be one of {', '.join(warmup.MODES)}, got {options.warmup!r}")
        for name, values in (("--warmup-lengths", options.warmup_lengths), ("--warmup-batch-sizes", options.warmup_batch_sizes)):
            if values is not None and (not values or min(values) < 1):
                raise CheckpointError(f"{name} must be positive numbers, e.g. 16,64,256")
        # KV caches grow on demand; what the engine can hold at once is its running requests at full context
        capacity = options.max_running_requests * options.context_length
        if options.min_kv_tokens > capacity:
            raise CheckpointError(
                f"min_kv_tokens ({options.min_kv_tokens}) exceeds what the torch engine can hold at once: "
                f"--max-running-requests ({options.max_running_requests}) × --context-length ({options.context_length}) = {capacity}"
            )

    @classmethod
    def load(cls, checkpoint: Checkpoint, options: EngineOptions) -> "TorchEngine":
        from memt_core.models.weights import load_model

        cls.check_options(options)
        model = load_model(checkpoint, device=options.device, dtype=DTYPES[options.dtype])
        durable = None
        if options.snapshot_store:
            from memt_core.memory.durable import DirectorySnapshotStore

            memory = checkpoint.memory
            durable = DirectorySnapshotStore(options.snapshot_store, identity=checkpoint.identity(),
                                             layers=memory.memory_layers, shape=memory.state_shape())
        owned = None
        if options.ownership:
            from memt_core.memory.ownership import Owned, RedisOwnership

            owned = Owned(RedisOwnership(options.ownership, owner=options.node_id or "memt", ttl=options.ownership_ttl))
        return cls(
            model, state_directory=options.state_directory, snapshot_store=durable, owned=owned,
            max_running_requests=options.max_running_requests, max_commit_batch=options.max_commit_batch,
            torch_compile=options.torch_compile, threads=cpu_threads(options), fused_decode=options.fused_decode,
            cuda_graphs=options.cuda_graphs, cuda_graph_max_tokens=options.cuda_graph_max_tokens,
            warmup=warmup.plan(options.warmup, torch.device(options.device).type, max_rows=options.max_running_requests,
                               context_length=options.context_length, lengths=options.warmup_lengths,
                               batch_sizes=options.warmup_batch_sizes),
        )

    @classmethod
    def settings(cls, options: EngineOptions) -> dict:
        return {
            "engine": cls.name, "device": options.device, "dtype": options.dtype,
            "max_running_requests": options.max_running_requests, "max_commit_batch": options.max_commit_batch,
            "context_length": options.context_length, "min_kv_tokens": options.min_kv_tokens,
            "torch_compile": options.torch_compile,
            "fused_decode": options.fused_decode and not options.torch_compile,
            "cuda_graphs": {"max_tokens": options.cuda_graph_max_tokens} if options.cuda_graphs else False,
            "warmup": _described(warmup.plan(options.warmup, torch.device(options.device).type, max_rows=options.max_running_requests,
                                              context_length=options.context_length, lengths=options.warmup_lengths,
                                              batch_sizes=options.warmup_batch_sizes)),
            "inductor_options": inductor_options(options.device) if options.torch_compile else None,
            "torch_threads": cpu_threads(options) or f"torch's default ({torch.get_num_threads()})",
            "kv_cache": "grows per request (transformers DynamicCache)",
        }

    def __init__(
        self,
        model: MemTForCausalLM,
        *,
        state_directory=None,
        snapshot_store=None,
        owned=None,
        max_running_requests: int = 32,
        max_commit_batch: int = 4,
        torch_compile: bool = False,
        compile_options: dict | None = None,
        module_guards: bool = False,
        threads: int | None = None,
        fused_decode: bool = True,
        cuda_graphs: bool = False,
        cuda_graph_max_tokens: int = 4096,
        warmup: warmup.WarmupPlan | None = None,  # what runs before the engine reports ready (memt_core.engine.warmup)
    ):
        self.model = model
        self.threads = threads
        self.checkpoint = model.checkpoint
        self.device = next(model.parameters()).device
        # the shared batch's decode step, compiled with --enable-torch-compile, and short prompts' prefills once
        # warmed up (``_warm_up``); longer prefills and commits stay eager
        self.compiled = torch_compile
        self._prefill_compiled = False
        self.compile_options = inductor_options(self.device) if compile_options is None else dict(compile_options)
        self._decoder = compile_model(self.compile_options, model, module_guards) if torch_compile else model
        # the eager decode step in fewer kernel launches where the family has one (memt_core.models.decode); the
        # compiled step is the model's own, compiled
        self._fused = fused_decoder(model) if fused_decode and not torch_compile else None
        # opt-in: the fused step replayed from CUDA graphs (memt_core.engine.graphs)
        self._graphs = None
        if cuda_graphs:
            if self._fused is None:
                raise CheckpointError("--enable-cuda-graph replays the fused decode step, which this model's family does not have")
            from memt_core.engine.graphs import GraphDecode

            self._graphs = GraphDecode(self._fused, max_rows=max_running_requests, max_tokens=cuda_graph_max_tokens)
        self.warmup = warmup
        self._ready = threading.Event()
        self._warming: dict = {}
        memory = self.checkpoint.memory
        self.store = MemoryStore(
            identity=self.checkpoint.identity(),
            layers=memory.memory_layers,
            shape=memory.state_shape(),
            device=self.device,
            state_directory=state_directory,
            durable=snapshot_store,
            owned=owned,
        )
        self.stop_ids = eos_token_ids(model)
        self.max_running = max_running_requests
        self.max_commit_batch = max_commit_batch
        self._stats = EngineStats()
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: deque[QueryJob] = deque()
        self._commits: deque[CommitJob] = deque()
        self._rows: list[QueryJob] = []  # the shared decode batch (batchable caches)
        self._solo: list[QueryJob] = []  # running queries whose caches cannot be batched
        self._batch_cache = None
        self._batch_mask: torch.Tensor | None = None
        self._batch_read: tuple[list[QueryJob], dict | None] = ([], None)  # the rows it was stacked for, their memory read
        self._by_rid: dict[str, QueryJob] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="memt-engine", daemon=True)
        self._failed: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "TorchEngine":
        if self.threads is not None:  # torch's thread count is per thread; the worker takes it from this one
            torch.set_num_threads(self.threads)
        if self.compiled:
            self._warm_up()
        self._thread.start()
        return self

    def _warm_up(self) -> None:
        """Compile the decode step for one row and for several, after prompts of one token and of more (a size
        of 1 is a shape of its own to the compiler), then the prefill of short prompts (``COMPILED_PREFILL_TOKENS``)
        and a decode step after it, so no request waits for the compiler."""
        started = time.monotonic()
        log.info("compiling the decode step and short prefills (torch.compile; about a minute on a CPU, less with a warm cache)")
        claimed = False
        with torch.no_grad():  # the worker thread's grad mode: the compiled code is guarded on it
            for lengths in ((5,), (5, 7), (1,), (1, 1)):  # unusual lengths beyond 1, so that no size is taken for another
                rows, cache, mask = len(lengths), None, None
                for length in lengths:
                    out = self.model(torch.zeros(1, length, dtype=torch.long, device=self.device),
                                     past_key_values=DynamicCache(config=self.model.config), use_cache=True, logits_to_keep=1)
                    if not kv.batchable(out.past_key_values):
                        log.info("this model's caches decode one row at a time, uncompiled: nothing to compile")
                        return
                    if not claimed:  # before anything is compiled for it
                        claim_architecture(self.model)
                        claimed = True
                    own = torch.ones(1, length, dtype=torch.long, device=self.device)
                    cache, mask = (out.past_key_values, own) if cache is None else kv.join(cache, mask, out.past_key_values, own)
                ids = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
                positions = mask.sum(dim=1, keepdim=True)
                mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long, device=self.device)], dim=1)
                self._decode(ids, positions, mask, memory_batch(self.model, [None] * rows, zeros=True), cache)
            self._prefill_compiled = True
            for length in (3, 9, 17):  # short prompts' prefills, and a decode step after each (its cache is laid out anew)
                out = self._forward_prompt(torch.zeros(1, length, dtype=torch.long, device=self.device), None, DynamicCache(config=self.model.config))
                mask = torch.ones(1, length + 1, dtype=torch.long, device=self.device)
                positions = torch.full((1, 1), length, dtype=torch.long, device=self.device)
                self._decode(torch.zeros(1, 1, dtype=torch.long, device=self.device), positions, mask, memory_batch(self.model, [None], zeros=True), out.past_key_values)
        log.info("decode step and short prefills compiled in %.0f s", time.monotonic() - started)

    def _warm(self) -> None:
        """Before taking work, in the worker thread: capture the CUDA graphs and run the warm-up plan's shapes
        (``memt_core.engine.warmup``), so that no request pays a kernel's first call at its shape."""
        plan = self.warmup
        if self._graphs is None and plan is None:
            return
        started = time.monotonic()
        if self._graphs is not None:
            self._warming = {"phase": "capturing CUDA graphs"}
            self._graphs.capture_all()
            log.info("captured %d CUDA graphs of the decode step in %.1f s", len(self._graphs.graphs), time.monotonic() - started)
        if plan is None:
            return
        config, device = self.model.config, self.device
        token = config.pad_token_id if config.pad_token_id is not None else 0
        done = 0
        for length in plan.lengths:
            if self._stopping:
                return
            self._warming = {"phase": "prompts and commits", "shapes_done": done, "shapes": plan.shapes, "length": length}
            ids = torch.full((1, length), token, dtype=torch.long, device=device)
            self._forward_prompt(ids, None, DynamicCache(config=config))
            self.model(ids, memory=memory_batch(self.model, [None], zeros=True), past_key_values=DynamicCache(config=config),
                       use_cache=True, logits_to_keep=1)
            commit_batch(self.model, [MemoryState()], [ids[0]])
            done += 1
        for rows in plan.batch_sizes:
            if self._stopping:
                return
            self._warming = {"phase": "decode steps", "shapes_done": done, "shapes": plan.shapes, "rows": rows}
            cache = mask = None
            for _ in range(rows):
                out = self._forward_prompt(torch.full((1, 3), token, dtype=torch.long, device=device), None, DynamicCache(config=config))
                own = torch.ones(1, 3, dtype=torch.long, device=device)
                if not kv.batchable(out.past_key_values):
                    break  # decoded one row at a time: the prompt's prefill was its shape
                cache, mask = (out.past_key_values, own) if cache is None else kv.join(cache, mask, out.past_key_values, own)
            if cache is not None:
                for read in (None, memory_batch(self.model, [None] * rows, zeros=True)):
                    ids = torch.full((rows, 1), token, dtype=torch.long, device=device)
                    positions = mask.sum(dim=1, keepdim=True)
                    mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long, device=device)], dim=1)
                    cache = self._decode(ids, positions, mask, read, cache).past_key_values
            done += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._warming = {"phase": "done", "shapes_done": done, "shapes": plan.shapes}
        log.info("warmed up %d prompt/commit lengths (%d-%d tokens) and %d decode batch sizes in %.1f s",
                 len(plan.lengths), plan.lengths[0], plan.lengths[-1], len(plan.batch_sizes), time.monotonic() - started)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def warmup_progress(self) -> dict:
        return dict(self._warming)

    def _decode(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, read: dict | None, cache):
        """One decode step of the shared batch, reading ``read`` (``_rows_read``)."""
        if self._graphs is not None:
            out = self._graphs.step(ids, positions, mask, read, cache)
            if out is not None:
                return out
        if self._fused is not None and self._fused.can_run(ids, cache):
            return self._fused(ids, memory=read, past_key_values=cache, attention_mask=mask, position_ids=positions)
        return self._decoder(ids, memory=read, past_key_values=cache, use_cache=True, attention_mask=mask,
                             position_ids=positions, logits_to_keep=1)

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._failed is None

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def stats(self) -> EngineStats:
        return self._stats

    def capabilities(self) -> dict:
        return {"device": str(self.device), "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch.")}

    # ------------------------------------------------------------------ asyncio-side API

    async def apply(self, effect: fx.Effect) -> Any:
        """Carry out a protocol effect. Memory effects run here; cancels reach the worker."""
        if isinstance(effect, fx.CancelRequest):
            return self.cancel(effect.rid)
        if isinstance(effect, (fx.ImportSnapshot, fx.ExportSnapshot, fx.DeleteSnapshot)) or (self.store.durable is not None and isinstance(effect, DURABLE_EFFECTS)):
            # file reads, writes and fsyncs stay off the event loop; the protocol holds the session meanwhile
            return await asyncio.to_thread(self.store.apply, effect)
        return self.store.apply(effect)

    async def housekeeping(self) -> None:
        lost = await asyncio.to_thread(self.store.renew_ownership)
        for session in lost:
            log.warning("lost ownership of session %r: its next durable write will be refused", session)

    def committed(self, session: str, transaction: str, nonce: str) -> bool:
        state = self.store.sessions.get(session)
        candidate = state.candidates.get(transaction) if state else None
        return bool(candidate and nonce in candidate.applied)

    async def commit(self, session: str, transaction: str, nonce: str, ids: list[int]) -> CommitInfo:
        """Fold ``ids`` into the transaction's candidate; resolves when the candidate holds them."""
        self.store.candidate(session, transaction)  # fail fast if the protocol and engine disagree
        self._check_alive()
        loop = asyncio.get_running_loop()
        job = CommitJob(session, transaction, nonce, list(ids), loop.create_future(), loop)
        self._inbox.put(job)
        return await asyncio.shield(job.future)

    def query(
        self,
        rid: str,
        prompt: list[int],
        params: SamplingParams,
        *,
        session: str | None = None,
        memory_read: bool = True,
        retain: bool = False,
        incremental: bool = True,
    ) -> AsyncIterator[TokenEvent]:
        """Start generating; returns an async iterator of token events ending with a finish event.

        Reads the session's published memory as it is now (or none when ``memory_read`` is off or
        ``session`` is None). For a ``retain`` session, ``prompt`` must extend the acknowledged prefix
        of the previous query, whose native context is then reused. ``incremental=False``: the tokens
        after the first come with the finish event, in one wake-up of the event loop instead of one per
        token (each wake-up stalls this thread while the loop holds the GIL).
        """
        self._check_alive()
        loop = asyncio.get_running_loop()
        memory, version, retained = None, 0, None
        if session is not None:
            state = self.store.get(session)
            memory = state.published if memory_read else None
            version = state.version
            if retain:
                retained = self._take_retained(session, state, prompt, version, memory_read)
        job = QueryJob(
            rid=rid, prompt=list(prompt), memory=memory, params=params, events=asyncio.Queue(), loop=loop,
            session=session, retain=retain, retained=retained, memory_version=version, memory_read=memory_read,
            incremental=incremental,
        )
        self._by_rid[rid] = job
        self._inbox.put(job)
        return self._events(job)

    def check_prompt(self, session: str, prompt: list[int]) -> None:
        """Refuse a query that does not extend the session's retained context (before anything is admitted)."""
        state = self.store.sessions.get(session)
        retained = state.retained if state is not None else None
        if retained is None:
            return
        n = len(retained.acknowledged)
        if len(prompt) <= len(retained.tokens) or tuple(prompt[:n]) != retained.acknowledged:
            raise InvalidRequest(
                f"this session retains native context: the query must extend the acknowledged prefix of {n} tokens "
                "exactly (or call kv_reset first)"
            )

    def _take_retained(self, session: str, state, prompt: list[int], version: int, memory_read: bool) -> RetainedKV | None:
        self.check_prompt(session, prompt)
        retained, state.retained = state.retained, None
        if retained is None:
            return None
        if retained.memory_version != version or retained.memory_read != memory_read:
            return None  # memory changed since: rebuild the context from the prompt
        return retained

    async def _events(self, job: QueryJob) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                event = await job.events.get()
                yield event
                if event.finish_reason is not None or event.error is not None:
                    return
        finally:
            if self._by_rid.get(job.rid) is job:
                job.cancelled = True  # consumer went away: stop the work
                self._inbox.put(("wake",))

    def cancel(self, rid: str) -> bool:
        """Stop a running query; its iterator ends with finish_reason "abort". False if unknown."""
        job = self._by_rid.get(rid)
        if job is None:
            return False
        job.cancelled = True
        self._inbox.put(("wake",))
        return True

    def _check_alive(self) -> None:
        if not self.alive:
            raise WorkerUnavailable(f"the engine worker is not running ({self._failed!r})")

    # ------------------------------------------------------------------ worker thread

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self._warm()
            self._ready.set()
            while not self._stopping:
                self._drain(block=not (self._commits or self._waiting or self._rows or self._solo))
                if self._stopping:
                    break
                if self._commits:
                    self._run_commits()
                self._admit()
                self._step()
        except BaseException as exc:  # the worker must never die silently
            log.exception("engine worker failed")
            self._failed = exc
            self._fail_all(WorkerUnavailable(f"engine worker failed: {exc!r}"))

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if item is None:
                self._stopping = True
            elif isinstance(item, QueryJob):
                self._waiting.append(item)
            elif isinstance(item, CommitJob):
                self._commits.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        self._stats.waiting = len(self._waiting)

    def _run_commits(self) -> None:
        jobs = [self._commits.popleft() for _ in range(min(self.max_commit_batch, len(self._commits)))]
        try:
            candidates = [self.store.candidate(job.session, job.transaction) for job in jobs]
            results = commit_batch(self.model, [c.memory for c in candidates], [job.ids for job in jobs])
        except Exception as exc:  # nothing was applied: the candidates are unchanged
            log.exception("commit failed")
            error = exc if isinstance(exc, MemTError) else BadGeneration(f"commit failed in the engine: {exc!r}")
            for job in jobs:
                job.loop.call_soon_threadsafe(set_exception, job.future, error)
            return
        for job, candidate, result in zip(jobs, candidates, results):
            candidate.memory = result.memory
            candidate.applied.append(job.nonce)
            self._stats.commits += 1
            self._stats.commit_tokens += result.tokens
            self._stats.write_events += result.write_events * len(self.model.memory_layers)
            job.loop.call_soon_threadsafe(set_result, job.future, CommitInfo(result.tokens, result.write_events))

    def _admit(self) -> None:
        while self._waiting and len(self._rows) + len(self._solo) < self.max_running:
            job = self._waiting.popleft()
            if job.cancelled:
                self._finish(job, "abort")
                continue
            if job.params.max_new_tokens == 0:
                self._finish(job, "length")
                continue
            try:
                self._prefill(job)
            except Exception as exc:
                log.exception("prefill failed")
                self._finish(job, None, error=exc if isinstance(exc, MemTError) else BadGeneration(f"prefill failed: {exc!r}"))
                continue
            if self._emit(job):
                continue
            if kv.batchable(job.cache):
                mask = torch.ones(1, job.fed, dtype=torch.long, device=self.device)
                if self._batch_cache is None:
                    self._batch_cache, self._batch_mask = job.cache, mask
                else:
                    self._batch_cache, self._batch_mask = kv.join(self._batch_cache, self._batch_mask, job.cache, mask)
                job.cache = None
                self._rows.append(job)
            else:
                self._solo.append(job)
        self._stats.running = len(self._rows) + len(self._solo)
        self._stats.waiting = len(self._waiting)

    def _prefill(self, job: QueryJob) -> None:
        job.sampler = Sampler(job.params, prompt=tuple(job.prompt), end_ids=frozenset(self.stop_ids | set(job.params.stop_token_ids)))
        if job.retained is not None:
            cache, start = job.retained.cache, len(job.retained.tokens)
        else:
            cache, start = DynamicCache(config=self.model.config), 0
        feed = torch.tensor([job.prompt[start:]], dtype=torch.long, device=self.device)
        out = self._forward_prompt(feed, job.memory, cache, fresh=job.retained is None)
        job.cache, job.fed = out.past_key_values, len(job.prompt)
        self._stats.prompt_tokens += feed.shape[1]
        job.output.append(job.sampler(out.logits[0, -1]))

    def _forward_prompt(self, feed: torch.Tensor, memory: MemoryState | None, cache, *, fresh: bool = True):
        """The prompt's forward pass: by the compiled step where it was warmed up for it (a fresh cache, a prompt of
        ``COMPILED_PREFILL_TOKENS``, its memory read as all-zero states when empty, which add exactly nothing), else eager."""
        low, high = COMPILED_PREFILL_TOKENS
        if self._prefill_compiled and fresh and low <= feed.shape[1] <= high:
            read = memory_batch(self.model, [memory], zeros=True)
            return self._decoder(feed, memory=read, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return self.model(feed, memory=memory_batch(self.model, [memory]), past_key_values=cache, use_cache=True, logits_to_keep=1)

    def _verdict(self, job: QueryJob) -> tuple[str, int | None] | None:
        """Whether the newest token ends the request: (finish_reason, matched stop token) or None."""
        token = job.output[-1]
        if job.cancelled:
            return "abort", None
        if (token in self.stop_ids or token in job.params.stop_token_ids) and not job.params.skip_eos:
            return "stop", token
        if len(job.output) >= job.params.max_new_tokens:
            return "length", None
        return None

    def _emit(self, job: QueryJob, cache_of_row=None) -> bool:
        """Send the newest token, or finish the request with it. Returns True when finished.

        ``cache_of_row`` produces the request's own cache when it must be retained at the end.
        """
        self._stats.generated_tokens += 1
        verdict = self._verdict(job)
        if verdict is None:
            self._post(job, self._token_event(job))
            return False
        reason, matched = verdict
        if reason == "abort":
            job.output.pop()
            self._finish(job, "abort")
            return True
        if job.retain and job.session is not None:
            self._retain(job, job.cache if cache_of_row is None else cache_of_row())
        self._finish(job, reason, token=job.output[-1], matched=matched)
        return True

    def _finish(self, job: QueryJob, reason: str | None, *, token: int | None = None, matched: int | None = None, error: Exception | None = None) -> None:
        self._by_rid.pop(job.rid, None)
        event = self._token_event(job) if token is not None else TokenEvent(None)
        event.finish_reason, event.matched_stop, event.error = reason, matched, error
        self._post(job, event, last=True)

    @staticmethod
    def _post(job: QueryJob, event: TokenEvent, *, last: bool = False) -> None:
        """Hand ``event`` to the consumer's loop; a non-incremental job's events after the first wait for the last."""
        if not job.incremental and not last and len(job.output) > 1:
            job.held.append(event)
            return
        events, job.held = job.held + [event], []
        job.loop.call_soon_threadsafe(put_all, job.events, events)

    @staticmethod
    def _token_event(job: QueryJob) -> TokenEvent:
        choice = job.sampler.last if job.sampler is not None else None
        if choice is None:
            return TokenEvent(job.output[-1])
        return TokenEvent(choice.token, logprob=choice.logprob, top_logprobs=choice.top_logprobs)

    def _retain(self, job: QueryJob, cache) -> None:
        state = self.store.sessions.get(job.session)
        if state is None:
            return
        tokens = tuple(job.prompt + job.output[:-1])
        state.retained = RetainedKV(
            cache=cache, tokens=tokens, acknowledged=tuple(job.prompt + job.output),
            memory_version=job.memory_version, memory_read=job.memory_read,
        )

    def _step(self) -> None:
        if self._rows:
            self._batched_step()
        if not self._rows:
            self._batch_read = ([], None)  # let finished queries go
        for job in list(self._solo):
            self._solo_step(job)
        self._stats.running = len(self._rows) + len(self._solo)

    def _batched_step(self) -> None:
        rows = self._rows
        ids = torch.tensor([[job.last] for job in rows], dtype=torch.long, device=self.device)
        positions = torch.tensor([[job.fed] for job in rows], dtype=torch.long, device=self.device)
        mask = torch.cat([self._batch_mask, torch.ones(len(rows), 1, dtype=torch.long, device=self.device)], dim=1)
        out = self._decode(ids, positions, mask, self._rows_read(), self._batch_cache)
        self._batch_cache, self._batch_mask = out.past_key_values, mask
        self._stats.decode_steps += 1
        self._stats.decode_rows += len(rows)
        logits = out.logits[:, -1]
        chosen = self._argmax(rows, logits)
        keep, done = [], []
        for i, job in enumerate(rows):
            job.fed += 1
            job.output.append(job.sampler.take(chosen[i]) if i in chosen else job.sampler(logits[i]))
            if self._emit(job, lambda i=i: kv.extract(self._batch_cache, self._batch_mask, i)):
                done.append(i)
            else:
                keep.append(i)
        if done:
            self._rows = [rows[i] for i in keep]
            if keep:
                self._batch_cache, self._batch_mask = kv.select(self._batch_cache, self._batch_mask, keep)
            else:
                self._batch_cache, self._batch_mask = None, None
        self._drop_cancelled()

    @staticmethod
    def _argmax(rows: list[QueryJob], logits: torch.Tensor) -> dict[int, int]:
        """The tokens of the rows whose sampler takes the logits' argmax (``Sampler.plain``), by row: one argmax over
        them all and one read back to the host, not one per row."""
        plain = [i for i, job in enumerate(rows) if job.sampler.plain]
        if not plain:
            return {}
        picked = logits if len(plain) == len(rows) else logits[torch.tensor(plain, device=logits.device)]
        return dict(zip(plain, picked.argmax(dim=-1).tolist()))

    def _rows_read(self) -> dict | None:
        """The shared batch's memory read, stacked again only when its rows change (a query's memory is fixed).
        Compiled, every row reads a memory (zeros for none: the same answers, one graph with and without)."""
        stacked_for, read = self._batch_read
        if len(stacked_for) != len(self._rows) or any(a is not b for a, b in zip(stacked_for, self._rows)):
            read = memory_batch(self.model, [job.memory for job in self._rows], zeros=self.compiled)
            self._batch_read = (list(self._rows), read)
        return read

    def _drop_cancelled(self) -> None:
        cancelled = [i for i, job in enumerate(self._rows) if job.cancelled]
        if not cancelled:
            return
        for i in cancelled:
            self._finish(self._rows[i], "abort")
        keep = [i for i in range(len(self._rows)) if i not in cancelled]
        self._rows = [self._rows[i] for i in keep]
        if keep:
            self._batch_cache, self._batch_mask = kv.select(self._batch_cache, self._batch_mask, keep)
        else:
            self._batch_cache, self._batch_mask = None, None

    def _solo_step(self, job: QueryJob) -> None:
        if job.cancelled:
            self._solo.remove(job)
            self._finish(job, "abort")
            return
        ids = torch.tensor([[job.last]], dtype=torch.long, device=self.device)
        out = self.model(ids, memory=memory_batch(self.model, [job.memory]), past_key_values=job.cache, use_cache=True, logits_to_keep=1)
        job.cache = out.past_key_values
        job.fed += 1
        self._stats.decode_steps += 1
        self._stats.decode_rows += 1
        job.output.append(job.sampler(out.logits[0, -1]))
        if self._emit(job):
            self._solo.remove(job)

    def _fail_all(self, error: MemTError) -> None:
        for job in list(self._waiting) + self._rows + self._solo:
            self._post(job, TokenEvent(None, error=error), last=True)
        for job in self._commits:
            job.loop.call_soon_threadsafe(set_exception, job.future, error)


def fused_decoder(model: MemTForCausalLM):
    """The family's decode step in fewer launches (``Family.decode_step``) for ``model``, or None where it has none
    or it does not fit this model."""
    from memt_core.families.base import resolve

    reference = model.checkpoint.family.decode_step
    if reference is None:
        return None
    step = resolve(reference)
    return step(model) if step.supports(model) else None


def _described(plan) -> dict | None:
    """A warm-up plan as ``--dry-run`` prints it."""
    if plan is None:
        return None
    return {"lengths": list(plan.lengths), "batch_sizes": list(plan.batch_sizes)}
