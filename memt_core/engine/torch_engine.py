"""The torch engine's scheduler: admission, verdicts, sampling, events and stats for many sessions' queries and commits.

The engine is two parts, as in vLLM (scheduler → model runner) and SGLang (``Scheduler`` → ``TpModelWorker``):
this scheduler, which holds no device tensor, and the model runner (``memt_core.engine.runner``), which holds them
all and runs the model. One worker thread loops: it drains the inbox, writes one step record
(``memt_core.engine.step``: rows that leave, waiting commits batched, one decode step of every running query,
newly admitted prompts, handles to free), has the runner execute it, then samples each row's token from the
logits it got back, sends the token events and decides who finishes (continuous batching: requests join and
leave between steps). A sampled token is fed at the next step. Each row reads its own session's memory as it was
when the query was sent: the session store pins a fork of it (``MemoryStore.pin``). Results flow back to the
asyncio side through per-request queues and futures.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from typing import Any, AsyncIterator

import torch

from memt_core.checkpoint import Checkpoint
from memt_core.engine import budget, paged_kv, warmup
from memt_core.engine.admission import Admission
from memt_core.engine.state_slots import slots_for
from memt_core.engine.base import CommitInfo, Engine, EngineOptions, EngineStats, TokenEvent
from memt_core.engine.device import PROFILE_TOKENS, cpu_threads, cuda_kv_budget, inductor_options, memory_budget  # noqa: F401 (cpu_threads re-exported)
from memt_core.engine.jobs import CommitJob, QueryJob, put_all, set_exception, set_result
from memt_core.engine.runner import COMPILED_PREFILL_TOKENS, ModelRunner, fused_decoder  # noqa: F401 (re-exported)
from memt_core.engine.step import Commit, Decode, Handles, Leave, Prefill, Step, StepResult
from memt_core.engine.store import MemoryStore, RetainedKV, shared_stores
from memt_core.engine.warmup import WarmupPlan, including
from memt_core.errors import BadGeneration, CheckpointError, MemTError, WorkerUnavailable
from memt_core.models.memt import MemTForCausalLM
from memt_core.models.passes import eos_token_ids
from memt_core.protocol import effects as fx
from memt_core.sampling import Sampler, SamplingParams, greedy_rows

log = logging.getLogger("memt.engine")

#: effects that read or write the durable snapshot store when there is one
DURABLE_EFFECTS = (fx.NewMemory, fx.CopyMemory, fx.PublishCandidate, fx.ClearMemory, fx.DropSession, fx.UnloadSession)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


class TorchEngine(Engine):
    """Queries, commits and memory effects for every session of one model, on CPU or one GPU."""

    name = "torch"

    @classmethod
    def check_options(cls, options: EngineOptions) -> None:
        if options.deterministic_communication and options.parallel.world == 1:
            raise CheckpointError(
                "--deterministic-communication is for multi-rank engines (--tp-size above 1); the torch engine on one "
                "device has no collective communication to fix"
            )
        if options.extra:
            raise CheckpointError(f"the torch engine takes no engine-specific settings, got {sorted(options.extra)}")
        if options.parallel.world > 1:
            for flag, on in (("--enable-torch-compile", options.torch_compile), ("--enable-cuda-graph", options.cuda_graphs)):
                if on:
                    raise CheckpointError(f"{flag} is not built for several ranks yet: leave it out, or serve one rank (--tp-size 1)")
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
        budget.check_device(options.budget, options.device)
        runner = None
        parallel = options.parallel
        pool = budget.paged(options.budget, cuda_graphs=options.cuda_graphs, torch_compile=options.torch_compile)
        given = options.budget.max_total_tokens is not None or options.budget.mem_fraction_static is not None
        slots = slots_for(options.max_sessions, options.max_commit_batch) if given else None  # sized once, with a budget
        if parallel.world > 1:  # ranks as processes: this one serves, every one runs the steps (its own part, DP attention)
            from memt_core.parallel import dp, ranks

            runner_options = {"fused_decode": options.fused_decode and not parallel.dp_attention, "max_rows": options.max_running_requests,
                              "kv_cache_dtype": options.budget.kv_cache_dtype,
                              "memory_state_slots": slots}  # the pool, once its budget is known (below)
            model, group, processes = ranks.start(checkpoint, parallel, device=options.device, dtype=options.dtype,
                                                  runner_options=runner_options, threads=cpu_threads(options),
                                                  deterministic=options.deterministic_communication)
            runner = ranks.RankDriver(dp.rank_runner(model, group, **runner_options), group, processes)
            if parallel.dp_attention:
                runner = dp.DataParallelDriver(runner, parallel.dp)
        else:
            model = load_model(checkpoint, device=options.device, dtype=DTYPES[options.dtype])
        durable, owned = shared_stores(checkpoint, options)
        kv_budget = options.budget.max_total_tokens or cuda_kv_budget(
            model, options.budget.mem_fraction_static, profile_tokens=min(options.context_length, PROFILE_TOKENS),
            state_slots=slots or 0, rows=options.max_running_requests, ranks=parallel.world)
        if runner is not None and pool and kv_budget:  # every rank's pool, sized as rank 0 sized its budget
            runner.make_pool(kv_budget)
        return cls(
            model, runner=runner, state_directory=options.state_directory, snapshot_store=durable, owned=owned,
            max_running_requests=options.max_running_requests, max_commit_batch=options.max_commit_batch * parallel.session_ranks,
            max_total_tokens=kv_budget, memory_state_slots=slots, max_queued_requests=options.budget.max_queued_requests,
            kv_cache_dtype=options.budget.kv_cache_dtype, kv_pool_tokens=kv_budget if pool else None,
            torch_compile=options.torch_compile, threads=cpu_threads(options), fused_decode=options.fused_decode,
            cuda_graphs=options.cuda_graphs, cuda_graph_max_tokens=options.cuda_graph_max_tokens,
            warmup=warmup.of_options(options),
        )

    @classmethod
    def settings(cls, options: EngineOptions) -> dict:
        return {
            "engine": cls.name, "device": options.device, "dtype": options.dtype,
            "max_running_requests": options.max_running_requests, "max_commit_batch": options.max_commit_batch,
            "context_length": options.context_length, "min_kv_tokens": options.min_kv_tokens,
            "torch_compile": options.torch_compile,
            "fused_decode": (options.fused_decode and not options.torch_compile and options.parallel.ep == 1
                             and not options.parallel.dp_attention),
            "cuda_graphs": {"max_tokens": options.cuda_graph_max_tokens} if options.cuda_graphs else False,
            "warmup": warmup.described(warmup.of_options(options)),
            "inductor_options": inductor_options(options.device) if options.torch_compile else None,
            "torch_threads": cpu_threads(options) or f"torch's default ({torch.get_num_threads()})",
            "kv_cache": (f"a paged pool of {paged_kv.BLOCK}-token blocks, allocated at start for the KV budget" if budget.paged(
                options.budget, cuda_graphs=options.cuda_graphs, torch_compile=options.torch_compile) else "grows per request (transformers DynamicCache)"),
            "ranks_served": options.parallel.world,
            **options.budget.describe(),
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
        warmup: WarmupPlan | None = None,  # the served shapes run before the engine reports ready
        runner=None,  # several ranks: memt_core.parallel.ranks.RankDriver over rank 0's share of ``model``
        max_total_tokens: int | None = None,  # the KV budget of the running queries (memt_core.engine.admission)
        max_queued_requests: int | None = None,  # queries that may wait for admission (beyond: 503)
        memory_state_slots: int | None = None,  # memory states in slots allocated at start (None: each as it is made)
        kv_cache_dtype: str = "auto",  # fp8_e4m3: the KV cache in FP8 (memt_core.engine.fp8_kv)
        kv_pool_tokens: int | None = None,  # a paged KV pool of this many tokens (memt_core.engine.paged_kv)
    ):
        self.runner = runner or ModelRunner(
            model, torch_compile=torch_compile, compile_options=compile_options, module_guards=module_guards,
            fused_decode=fused_decode, cuda_graphs=cuda_graphs, cuda_graph_max_tokens=cuda_graph_max_tokens,
            max_rows=max_running_requests, kv_cache_dtype=kv_cache_dtype, kv_pool_tokens=kv_pool_tokens,
            memory_state_slots=memory_state_slots,
        )
        self.threads = threads
        self.checkpoint = getattr(model.checkpoint, "whole", model.checkpoint)  # a rank's share names the whole
        self.config = model.config
        self.device = self.runner.device
        self.compiled = torch_compile
        # the one warm-up plan: the served shapes, with the compile phase and the graphs' capture where they apply
        self.warmup = including(warmup, compiled=torch_compile, graphs=self.runner.graphs is not None)
        self._ready = threading.Event()
        self._warming: dict = {}
        self.handles = Handles()
        self._frees: deque[int] = deque()  # handles the sessions let go of, freed at the next step
        memory = self.checkpoint.memory
        self.store = MemoryStore(
            identity=self.checkpoint.identity(),
            layers=memory.memory_layers,
            shape=memory.state_shape(),
            table=self.runner,
            handles=self.handles,
            release=self._release,
            state_directory=state_directory,
            durable=snapshot_store,
            owned=owned,
        )
        self.stop_ids = eos_token_ids(model)
        self.max_running = max_running_requests
        self.max_commit_batch = max_commit_batch
        self.admission = Admission(budget=max_total_tokens, max_queued=max_queued_requests, padded=kv_pool_tokens is None,
                                   block=paged_kv.BLOCK if kv_pool_tokens is not None else 1)
        self._stats = EngineStats()
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: deque[QueryJob] = deque()
        self._commits: deque[CommitJob] = deque()
        self._running: list[QueryJob] = []  # admitted queries, in the order they joined
        self._leaving: list[Leave] = []  # rows that finished at the last step
        self._by_rid: dict[str, QueryJob] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="memt-engine", daemon=True)
        self._failed: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "TorchEngine":
        """Start the worker, which runs the warm-up plan before it takes work; the plan's compile phase runs first,
        here (a model this process cannot compile is refused by ``start``, with the compiler's error)."""
        if self.threads is not None:  # torch's thread count is per thread; the worker takes it from this one
            torch.set_num_threads(self.threads)
        log.info("memory budget: %s", self.capabilities()["memory_budget"])
        if self.warmup is not None and self.warmup.compile:
            self._progress({"phase": "compiling"})
            self.runner.compile()
        watch = getattr(self.runner, "watch", None)
        if watch is not None:  # several ranks: one that dies stops the server
            watch(self._rank_died)
        self._thread.start()
        return self

    def _rank_died(self, reason: str) -> None:
        """A rank's process exited: every request fails with 503 from now on (the server then exits)."""
        self._failed = WorkerUnavailable(f"the engine lost a rank: {reason}")
        self._fail_all(self._failed)

    def _progress(self, progress: dict) -> None:
        self._warming = progress

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def warmup_progress(self) -> dict:
        return dict(self._warming)

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=30)
        stop_ranks = getattr(self.runner, "stop", None)
        if stop_ranks is not None:
            stop_ranks()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._failed is None

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def stats(self) -> EngineStats:
        a = self.admission
        self._stats.queued, self._stats.kv_reserved, self._stats.kv_reserved_peak = a.queued, a.reserved, a.peak
        self._stats.kv_budget, self._stats.refused_queue_full = a.budget, a.refused
        self._stats.kv_held_peak = getattr(self.runner, "kv_peak", None)  # measured on this process's caches
        return self._stats

    def capabilities(self) -> dict:
        return {"device": str(self.device), "dtype": str(next(self.runner.model.parameters()).dtype).removeprefix("torch."),
                "memory_budget": memory_budget(self.runner.model, self.admission.budget, self.runner.kv_cache_dtype, **{
                    part: getattr(self.runner, part, None) for part in ("pool", "slots", "recurrent", "retained")})}

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
            version = state.version
            self.admission.enter(len(prompt))  # before the session's context or memory is taken: a refusal changes nothing
            try:
                if retain:
                    retained = self._take_retained(session, state, prompt, version, memory_read)
                memory = self.store.pin(session) if memory_read else None
            except BaseException:
                self.admission.left_queue()
                raise
        else:
            self.admission.enter(len(prompt))
        job = QueryJob(
            rid=rid, handle=self.handles.new(), prompt=list(prompt), memory=memory, params=params, events=asyncio.Queue(),
            loop=loop, session=session, retain=retain, retained=retained, memory_version=version, memory_read=memory_read,
            incremental=incremental,
        )
        self._by_rid[rid] = job
        self._inbox.put(job)
        return self._events(job)

    def check_prompt(self, session: str, prompt: list[int]) -> None:
        self.store.check_prompt(session, prompt)

    def _take_retained(self, session: str, state, prompt: list[int], version: int, memory_read: bool) -> RetainedKV | None:
        self.check_prompt(session, prompt)
        retained = self.store.take_retained(state)
        if retained is None:
            return None
        if retained.memory_version != version or retained.memory_read != memory_read:
            self._release(retained.kv)
            return None  # memory changed since: rebuild the context from the prompt
        return retained

    def _release(self, handle: int) -> None:
        """Free a runner handle at the next step (after whatever that step still reads)."""
        self._frees.append(handle)
        self._inbox.put(("wake",))

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
            if self.warmup is not None:
                self.runner.warm(self.warmup, self._progress, lambda: self._stopping)
            self._ready.set()
            while not self._stopping:
                self._drain(block=not (self._commits or self._waiting or self._running or self._leaving or self._frees))
                if self._stopping:
                    break
                step, commits, admitted = self._schedule()
                if not step.empty:
                    self._absorb(self.runner.execute(step), commits, admitted)
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

    def _schedule(self) -> tuple[Step, list[CommitJob], list[QueryJob]]:
        """This iteration's step record, with the commit jobs and the admitted queries it runs."""
        leave, self._leaving = self._leaving, []
        free = []
        for job in [job for job in self._running if job.cancelled]:
            self._running.remove(job)
            self._finish(job, "abort")
            leave.append(Leave(job.handle))
        commit_jobs, commits = [], []
        while self._commits and len(commits) < self.max_commit_batch:
            job = self._commits.popleft()
            try:
                candidate = self.store.candidate(job.session, job.transaction)
            except MemTError as exc:
                job.loop.call_soon_threadsafe(set_exception, job.future, exc)
                continue
            commit_jobs.append(job)
            commits.append(Commit(candidate.memory, tuple(job.ids)))
        decode = tuple(Decode(job.handle, job.last, job.fed) for job in self._running)
        admitted, prefills = [], []
        while self._waiting and len(self._running) + len(admitted) < self.max_running:
            job = self._waiting[0]
            need = self.admission.need(len(job.prompt), job.params.max_new_tokens)
            retained = self.store.retained_tokens() if self.admission.budget is not None else 0
            missing = self.admission.room(need, retained)
            if missing:  # retained contexts are evicted before a query waits
                retained -= self.store.evict_retained(missing)
            if not (job.cancelled or self.admission.fits(need, alone=not (self._running or admitted), retained=retained)):
                break  # it waits, first in line, for running queries to end
            self._waiting.popleft()
            self.admission.left_queue()
            if job.cancelled or job.params.max_new_tokens == 0:
                self._finish(job, "abort" if job.cancelled else "length")
                free += [h for h in (job.memory, job.retained.kv if job.retained else None) if h is not None]
                continue
            job.sampler = Sampler(job.params, prompt=tuple(job.prompt), end_ids=frozenset(self.stop_ids | set(job.params.stop_token_ids)))
            start = len(job.retained.tokens) if job.retained is not None else 0
            job.reserved = need
            self.admission.admit(need, retained)
            prefills.append(Prefill(job.handle, tuple(job.prompt[start:]), memory=job.memory,
                                    retained=job.retained.kv if job.retained is not None else None))
            admitted.append(job)
        while self._frees:
            free.append(self._frees.popleft())
        self._stats.waiting = len(self._waiting)
        step = Step(leave=tuple(leave), commits=tuple(commits), decode=decode, prefills=tuple(prefills), free=tuple(free))
        return step, commit_jobs, admitted

    def _absorb(self, result: StepResult, commit_jobs: list[CommitJob], admitted: list[QueryJob]) -> None:
        """Hand out what a step produced: commit results, each row's sampled token, and the new queries' first."""
        self._settle_commits(result.commits, commit_jobs)
        by_handle = {job.handle: job for job in self._running}
        for block in result.decoded:
            rows = [by_handle[request] for request in block.requests]
            self._stats.decode_steps += 1
            self._stats.decode_rows += len(rows)
            chosen = greedy_rows([job.sampler for job in rows], block.values)
            for i, job in enumerate(rows):
                job.fed += 1
                job.output.append(job.sampler.take(chosen[i]) if i in chosen else job.sampler(block.values[i]))
                if self._emit(job):
                    self._running.remove(job)
        for job in admitted:
            logits = result.prefilled[job.handle]
            if isinstance(logits, Exception):  # the runner let go of what the request held
                self._finish(job, None, error=logits if isinstance(logits, MemTError) else BadGeneration(f"prefill failed: {logits!r}"))
                continue
            self._stats.prompt_tokens += len(job.prompt) - (len(job.retained.tokens) if job.retained is not None else 0)
            job.retained, job.fed = None, len(job.prompt)
            job.output.append(job.sampler(logits))
            if not self._emit(job):
                self._running.append(job)
        self._stats.running = len(self._running)

    def _settle_commits(self, outcomes, jobs: list[CommitJob]) -> None:
        if isinstance(outcomes, Exception):  # nothing was applied: the candidates are unchanged
            outcomes = [outcomes] * len(jobs)
        for job, outcome in zip(jobs, outcomes):
            if isinstance(outcome, Exception):  # a batch failed (with DP attention: one rank's): its candidates are unchanged
                error = outcome if isinstance(outcome, MemTError) else BadGeneration(f"commit failed in the engine: {outcome!r}")
                job.loop.call_soon_threadsafe(set_exception, job.future, error)
                continue
            state = self.store.sessions.get(job.session)
            candidate = state.candidates.get(job.transaction) if state is not None else None
            if candidate is not None:
                candidate.applied.append(job.nonce)
            self._stats.commits += 1
            self._stats.commit_tokens += outcome.tokens
            self._stats.write_events += outcome.write_events * len(self.checkpoint.memory.memory_layers)
            job.loop.call_soon_threadsafe(set_result, job.future, CommitInfo(outcome.tokens, outcome.write_events))

    def _verdict(self, job: QueryJob) -> tuple[str, int | None] | None:
        """Whether the newest token ends the request: (finish_reason, matched stop token) or None."""
        token = job.output[-1]
        if job.cancelled:
            return "abort", None
        if (token in self.stop_ids or token in job.params.stop_token_ids) and not job.params.skip_eos:
            return "stop", token
        if len(job.output) >= job.params.max_new_tokens or (job.reserved and len(job.prompt) + len(job.output) >= job.reserved):
            return "length", None  # max_new_tokens, or the KV budget (--max-total-tokens) reached
        return None

    def _emit(self, job: QueryJob) -> bool:
        """Send the newest token, or finish the request with it (its row leaves at the next step, its context kept
        for a ``retain_kv`` session). Returns True when finished."""
        self._stats.generated_tokens += 1
        verdict = self._verdict(job)
        if verdict is None:
            self._post(job, self._token_event(job))
            return False
        reason, matched = verdict
        if reason == "abort":
            job.output.pop()
            self._leaving.append(Leave(job.handle))
            self._finish(job, "abort")
            return True
        self._leaving.append(Leave(job.handle, retain=self._retain(job)))
        self._finish(job, reason, token=job.output[-1], matched=matched)
        return True

    def _retain(self, job: QueryJob) -> int | None:
        """For a ``retain_kv`` session, the handle the finished row's context is kept as (None: not kept)."""
        if not (job.retain and job.session is not None):
            return None
        handle = self.handles.new()
        retained = RetainedKV(kv=handle, tokens=tuple(job.prompt + job.output[:-1]), acknowledged=tuple(job.prompt + job.output),
                              memory_version=job.memory_version, memory_read=job.memory_read)
        return handle if self.store.retain(job.session, retained) else None

    def _finish(self, job: QueryJob, reason: str | None, *, token: int | None = None, matched: int | None = None, error: Exception | None = None) -> None:
        self._by_rid.pop(job.rid, None)
        self.admission.release(job.reserved)
        job.reserved = 0
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

    def _fail_all(self, error: MemTError) -> None:
        for job in list(self._waiting) + self._running:
            self._post(job, TokenEvent(None, error=error), last=True)
        for job in self._commits:
            job.loop.call_soon_threadsafe(set_exception, job.future, error)
