"""The model runner: every device tensor of the engine and every forward pass, driven by step records.

The scheduler (``memt_core.engine.torch_engine``) decides; this executes. It holds the model and its decode paths
(eager, fused, compiled, CUDA graphs), the shared decode batch's KV cache and mask, the KV of requests not in it
(prefilled this step, or decoded alone) and of sessions retaining their context, and the memory states — each
named by a handle the scheduler allocated (``memt_core.engine.step``). ``execute`` runs one ``Step`` and returns
the logits rank 0 samples from; the memory methods (``put_memory``, ``fork_memory``, ``memory``) carry out what the
session store asks. The runner is rank-symmetric: given the same calls in the same order, every rank does the
same work on its own shard.

A memory state is never changed in place (``MemoryState``): a fork shares its tensors, a commit stores new ones,
so a request's pinned memory reads the same whatever its session does meanwhile.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from memt_core.engine import kv
from memt_core.engine.device import claim_architecture, compile_model, inductor_options
from memt_core.engine.fp8_kv import new_cache
from memt_core.engine.step import CommitOutcome, Decode, Leave, Logits, Prefill, Step, StepResult
from memt_core.engine.warmup import COMPILE_DECODE_ROWS, COMPILE_PREFILLS, WarmupPlan
from memt_core.errors import CheckpointError
from memt_core.memory.state import MemoryState
from memt_core.models.memt import MemTForCausalLM
from memt_core.models.passes import commit_batch, memory_batch

log = logging.getLogger("memt.engine")

#: With ``--enable-torch-compile``, prompts of ``COMPILED_PREFILL_TOKENS[0]`` to ``[1]`` tokens on a fresh cache are
#: prefilled by the compiled step as well: on the CPU a demo-model prompt of 31 tokens in about half the time, of
#: 200 in 0.85-0.9x, while from several hundred tokens the eager pass is the faster. Shorter prompts are shapes of
#: their own to the compiler, and stay eager.
COMPILED_PREFILL_TOKENS = (3, 256)


class ModelRunner:
    """Prefill, decode, commit and the memory and KV tensors of one model on one device (one rank's shard)."""

    def __init__(
        self,
        model: MemTForCausalLM,
        *,
        torch_compile: bool = False,
        compile_options: dict | None = None,
        module_guards: bool = False,
        fused_decode: bool = True,
        cuda_graphs: bool = False,
        cuda_graph_max_tokens: int = 4096,
        max_rows: int = 32,
        kv_cache_dtype: str = "auto",  # fp8_e4m3: full-attention keys and values stored in FP8 (memt_core.engine.fp8_kv)
        kv_pool_tokens: int | None = None,  # a paged KV pool of this many tokens, allocated now (memt_core.engine.paged_kv)
        memory_state_slots: int | None = None,  # memory states in slots allocated now (memt_core.engine.state_slots)
    ):
        self.model = model
        self.kv_cache_dtype = kv_cache_dtype
        self.device = next(model.parameters()).device
        self.pool, self.max_rows = None, max_rows
        if kv_pool_tokens is not None:
            self.make_pool(kv_pool_tokens)
        self.heads: slice | None = getattr(model, "memory_heads", None)  # on several ranks: this rank's memory heads
        self.slots = self.recurrent = self.retained = None
        if memory_state_slots is not None:  # with a budget: the states in slots allocated once
            from memt_core.engine.state_slots import RecurrentSlots, RetainedSlots, StateSlots, sessions_of

            self.recurrent, self.retained = RecurrentSlots(max_rows), RetainedSlots(sessions_of(memory_state_slots))

            memory = getattr(model.checkpoint, "whole", model.checkpoint).memory  # a rank's share names the whole
            heads, keys, values = memory.state_shape()[1:]
            heads = len(range(heads)[self.heads]) if self.heads is not None else heads  # a rank holds its heads
            self.slots = StateSlots(tuple(memory.memory_layers), (heads, keys, values), memory_state_slots, device=self.device)
        # the shared batch's decode step, compiled with --enable-torch-compile, and short prompts' prefills once
        # warmed up (``warm``); longer prefills and commits stay eager
        self.compiled = torch_compile
        self.compile_done = False  # the warm-up's compile phase has run
        self.prefill_compiled = False
        self.compile_options = inductor_options(self.device) if compile_options is None else dict(compile_options)
        self.decoder = compile_model(self.compile_options, model, module_guards) if torch_compile else model
        # the eager decode step in fewer kernel launches where the family has one (memt_core.models.decode); the
        # compiled step is the model's own, compiled
        self.fused = fused_decoder(model) if fused_decode and not torch_compile else None
        # opt-in: the fused step replayed from CUDA graphs (memt_core.engine.graphs)
        self.graphs = None
        if cuda_graphs:
            if self.fused is None:
                raise CheckpointError("--enable-cuda-graph replays the fused decode step, which this model's family does not have")
            from memt_core.engine.graphs import GraphDecode

            self.graphs = GraphDecode(self.fused, max_rows=max_rows, max_tokens=cuda_graph_max_tokens)
        # on several ranks (memt_core.parallel.shard): the collectives, and which of the memory's heads this rank holds
        self.group = getattr(model, "group", None)
        self.memories: dict[int, MemoryState] = {}
        self.caches: dict[int, Any] = {}  # request or retained handle → its own KV cache (batch size 1)
        self.reads: dict[int, int | None] = {}  # running request → the memory handle it reads
        self.rows: list[int] = []  # the requests of the shared decode batch, in its order
        self.batch_cache = None
        self.batch_mask: torch.Tensor | None = None
        self._read: tuple[tuple[int, ...], dict | None] = ((), None)  # the rows the batch's read was stacked for, and it
        self.kv_peak = 0  # the most KV tokens the caches held after a step (``kv.held_tokens``), measured

    def make_pool(self, tokens: int) -> None:
        """Allocate the paged KV pool for ``tokens`` (``memt_core.engine.paged_kv``): at start, once the budget is known
        (on several ranks, a call every rank makes)."""
        from memt_core.engine.paged_kv import KVPool

        weight = next(self.model.parameters())
        self.pool = KVPool(self.model.config, tokens, rows=2 * self.max_rows + 64, dtype=weight.dtype, device=weight.device)

    def new_cache(self):
        """A fresh KV cache for one request (its full-attention layers in FP8 with ``--kv-cache-dtype fp8_e4m3``)."""
        return self.pool.new_cache() if self.pool is not None else new_cache(self.model.config, self.kv_cache_dtype)

    # ------------------------------------------------------------------ memory states

    def put_memory(self, handle: int, state: MemoryState) -> None:
        """Hold ``state`` (a whole memory, every head) as ``handle``: on a rank, its heads only."""
        if self.heads is not None:
            state = MemoryState({layer: state.get(layer)[:, self.heads].contiguous() for layer in state.layers()})
        state = state.to(self.device)
        self.memories[handle] = self.slots.put(handle, state) if self.slots is not None else state

    def fork_memory(self, source: int, handle: int) -> None:
        self.memories[handle] = self.memories[source].fork()
        if self.slots is not None:
            self.slots.share(source, handle)

    def drop_memory(self, handle: int | None) -> None:
        """Let go of the state ``handle`` names (its slot is free once no other handle names it)."""
        if self.memories.pop(handle, None) is not None and self.slots is not None:
            self.slots.drop(handle)

    def memory(self, handle: int | None) -> MemoryState:
        """The state ``handle`` names, as this rank holds it."""
        return MemoryState() if handle is None else self.memories[handle]

    def gather_memory(self, handle: int | None) -> MemoryState:
        """The whole state ``handle`` names, every rank's heads joined (a collective on several ranks)."""
        state = self.memory(handle)
        if self.heads is None:
            return state
        return MemoryState({layer: self.group.gather_dim(state.get(layer), 1) for layer in state.layers()})

    # ------------------------------------------------------------------ one step

    def execute(self, step: Step) -> StepResult:
        result = StepResult()
        if step.leave:
            self._leave(step.leave)
        if step.commits:
            result.commits = self._commit(step.commits)
        if step.decode:
            result.decoded = self._decode_rows(step.decode)
        for prefill in step.prefills:
            result.prefilled[prefill.request] = self._prefill(prefill)
        for handle in step.free:
            self.drop_memory(handle)
            self.caches.pop(handle, None)
            if self.retained is not None:
                self.retained.drop(handle)
        self.kv_peak = max(self.kv_peak, self.kv_held())
        return result

    def kv_held(self) -> int:
        """The KV tokens the full-attention caches hold now: the paged pool's blocks in use, else every cache's
        rows × length (the shared batch's padding included)."""
        if self.pool is not None:
            return self.pool.used_tokens()
        caches = list(self.caches.values()) + ([self.batch_cache] if self.batch_cache is not None else [])
        return sum(kv.held_tokens(cache) for cache in caches)

    def _leave(self, leaving: tuple[Leave, ...]) -> None:
        gone = []
        for leave in leaving:
            if leave.request in self.rows:
                i = self.rows.index(leave.request)
                if leave.retain is not None:
                    self._keep(leave.retain, kv.extract(self.batch_cache, self.batch_mask, i))
                gone.append(i)
            else:
                cache = self.caches.pop(leave.request, None)
                if leave.retain is not None and cache is not None:
                    self._keep(leave.retain, cache)
            self.drop_memory(self.reads.pop(leave.request, None))
        if gone:
            keep = [i for i in range(len(self.rows)) if i not in gone]
            self.rows = [self.rows[i] for i in keep]
            if keep:
                self.batch_cache, self.batch_mask = kv.select(self.batch_cache, self.batch_mask, keep, self.recurrent)
            else:
                self.batch_cache, self.batch_mask = None, None
                self._read = ((), None)  # let the finished queries' memory go

    def _keep(self, handle: int, cache) -> None:
        """A finished request's context, retained as ``handle`` (its linear-attention states in the retained slots)."""
        self.caches[handle] = cache
        if self.retained is not None:
            self.retained.keep(handle, cache)

    def _commit(self, commits) -> list[CommitOutcome] | Exception:
        try:
            results = commit_batch(self.model, [self.memory(c.memory) for c in commits], [list(c.tokens) for c in commits])
            # a candidate dropped meanwhile stays dropped
            new = {c.memory: r.memory for c, r in zip(commits, results) if c.memory in self.memories}
            self.memories.update(self.slots.replace(new) if self.slots is not None else new)
        except Exception as exc:  # nothing was applied: the candidates are unchanged
            log.exception("commit failed")
            return exc
        return [CommitOutcome(result.tokens, result.write_events) for result in results]

    def _prefill(self, p: Prefill):
        self.reads[p.request] = p.memory  # owned by the request from now on, let go when it leaves
        cache = None
        try:
            cache = self.caches.pop(p.retained) if p.retained is not None else self.new_cache()
            if p.retained is not None and self.retained is not None:
                self.retained.take(p.retained, cache)
            feed = torch.tensor([p.tokens], dtype=torch.long, device=self.device)
            out = self.forward_prompt(feed, self.memory(p.memory), cache, fresh=p.retained is None)
        except Exception as exc:
            log.exception("prefill failed")
            self.drop_memory(self.reads.pop(p.request))
            if self.pool is not None:
                self.pool.release(cache)  # not left to the traceback the error carries
            return exc
        self.caches[p.request] = out.past_key_values
        return out.logits[0, -1]

    def forward_prompt(self, feed: torch.Tensor, memory: MemoryState | None, cache, *, fresh: bool = True):
        """The prompt's forward pass: by the compiled step where it was warmed up for it (a fresh cache, a prompt of
        ``COMPILED_PREFILL_TOKENS``, its memory read as all-zero states when empty, which add exactly nothing), else eager."""
        low, high = COMPILED_PREFILL_TOKENS
        if self.prefill_compiled and fresh and low <= feed.shape[1] <= high:
            read = memory_batch(self.model, [memory], zeros=True)
            return self.decoder(feed, memory=read, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return self.model(feed, memory=memory_batch(self.model, [memory]), past_key_values=cache, use_cache=True, logits_to_keep=1)

    def _decode_rows(self, rows: tuple[Decode, ...]) -> list[Logits]:
        """Join the newly prefilled rows whose caches batch, then one step of the shared batch and one of each row
        decoded alone."""
        alone = []
        for row in rows:
            cache = self.caches.get(row.request)
            if cache is None:
                continue  # in the batch already
            if not kv.batchable(cache):
                alone.append(row)
                continue
            del self.caches[row.request]
            mask = torch.ones(1, row.position, dtype=torch.long, device=self.device)
            if self.batch_cache is None:
                self.batch_cache, self.batch_mask = cache, mask
            else:
                self.batch_cache, self.batch_mask = kv.join(self.batch_cache, self.batch_mask, cache, mask, self.recurrent)
            self.rows.append(row.request)
        decoded = []
        if self.rows:
            by_request = {row.request: row for row in rows}
            batch = [by_request[request] for request in self.rows]  # every row of the batch decodes every step
            ids = torch.tensor([[row.token] for row in batch], dtype=torch.long, device=self.device)
            positions = torch.tensor([[row.position] for row in batch], dtype=torch.long, device=self.device)
            mask = torch.cat([self.batch_mask, torch.ones(len(batch), 1, dtype=torch.long, device=self.device)], dim=1)
            out = self.decode(ids, positions, mask, self._rows_read(), self.batch_cache)
            self.batch_cache, self.batch_mask = out.past_key_values, mask
            decoded.append(Logits(tuple(self.rows), out.logits[:, -1]))
        for row in alone:
            ids = torch.tensor([[row.token]], dtype=torch.long, device=self.device)
            read = memory_batch(self.model, [self.memory(self.reads.get(row.request))])
            out = self.model(ids, memory=read, past_key_values=self.caches[row.request], use_cache=True, logits_to_keep=1)
            self.caches[row.request] = out.past_key_values
            decoded.append(Logits((row.request,), out.logits[:, -1]))
        return decoded

    def _rows_read(self) -> dict | None:
        """The shared batch's memory read, stacked again only when its rows change (a request's memory is fixed).
        Compiled, every row reads a memory (zeros for none: the same answers, one graph with and without)."""
        stacked_for, read = self._read
        if stacked_for != tuple(self.rows):
            read = memory_batch(self.model, [self.memory(self.reads.get(r)) for r in self.rows], zeros=self.compiled)
            self._read = (tuple(self.rows), read)
        return read

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, read: dict | None, cache):
        """One decode step of a batch, by CUDA graphs, the fused step or the (compiled) model, the first that can."""
        if self.graphs is not None:
            out = self.graphs.step(ids, positions, mask, read, cache)
            if out is not None:
                return out
        if self.fused is not None and self.fused.can_run(ids, cache):
            return self.fused(ids, memory=read, past_key_values=cache, attention_mask=mask, position_ids=positions)
        return self.decoder(ids, memory=read, past_key_values=cache, use_cache=True, attention_mask=mask,
                            position_ids=positions, logits_to_keep=1)

    # ------------------------------------------------------------------ warm-up

    def warm(self, plan: WarmupPlan, progress: Callable[[dict], None], stopping: Callable[[], bool]) -> None:
        """Run ``plan`` (``memt_core.engine.warmup``) in its order, telling ``progress`` each phase as it starts;
        ``stopping`` ends it early."""
        started = time.monotonic()
        if plan.compile and not self.compile_done:
            progress({"phase": "compiling"})
            self.compile()
        if plan.graphs and self.graphs is not None:
            progress({"phase": "capturing CUDA graphs"})
            self.graphs.capture_all()
            log.info("captured %d CUDA graphs of the decode step in %.1f s", len(self.graphs.graphs), time.monotonic() - started)
        if not plan.shapes:
            progress({"phase": "done"})
            return
        token = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        done = 0
        for length in plan.lengths:
            if stopping():
                return
            progress({"phase": "prompts and commits", "shapes_done": done, "shapes": plan.shapes, "length": length})
            ids = self._tokens(1, length, token)
            self.forward_prompt(ids, None, self.new_cache())
            self.model(ids, memory=memory_batch(self.model, [None], zeros=True), past_key_values=self.new_cache(),
                       use_cache=True, logits_to_keep=1)
            commit_batch(self.model, [MemoryState()], [ids[0]])
            done += 1
        for rows in plan.batch_sizes:
            if stopping():
                return
            progress({"phase": "decode steps", "shapes_done": done, "shapes": plan.shapes, "rows": rows})
            batch = self._prefilled([3] * rows, token)
            if batch is not None:
                cache, mask = batch
                for read in (None, memory_batch(self.model, [None] * rows, zeros=True)):
                    cache, mask = self._step(cache, mask, read, token)
            done += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        progress({"phase": "done", "shapes_done": done, "shapes": plan.shapes})
        log.info("warmed up %d prompt/commit lengths (%d-%d tokens) and %d decode batch sizes in %.1f s",
                 len(plan.lengths), plan.lengths[0] if plan.lengths else 0, plan.lengths[-1] if plan.lengths else 0,
                 len(plan.batch_sizes), time.monotonic() - started)

    def compile(self) -> None:
        """The compile phase: the decode step for the batches of ``COMPILE_DECODE_ROWS``, then the compiled prefill of
        ``COMPILE_PREFILLS`` and a decode step after each, so no request waits for the compiler. The engine runs it
        in the thread that starts it, before its worker (inductor compiles in worker processes of that thread), under
        the worker's grad mode (the compiled code is guarded on it)."""
        started = time.monotonic()
        log.info("compiling the decode step and short prefills (torch.compile; about a minute on a CPU, less with a warm cache)")
        self.compile_done = True
        with torch.no_grad():
            for lengths in COMPILE_DECODE_ROWS:
                batch = self._prefilled(lengths, 0, claim=True)
                if batch is None:
                    log.info("this model's caches decode one row at a time, uncompiled: nothing to compile")
                    return
                cache, mask = batch
                self._step(cache, mask, memory_batch(self.model, [None] * len(lengths), zeros=True), 0)
            self.prefill_compiled = True
            for length in COMPILE_PREFILLS:
                out = self.forward_prompt(self._tokens(1, length, 0), None, self.new_cache())
                own = torch.ones(1, length, dtype=torch.long, device=self.device)
                self._step(out.past_key_values, own, memory_batch(self.model, [None], zeros=True), 0)
        log.info("decode step and short prefills compiled in %.0f s", time.monotonic() - started)

    def _prefilled(self, lengths, token: int, *, claim: bool = False):
        """Prompts of ``lengths`` prefilled eagerly and joined into one batch: (cache, mask), or None where this
        model's caches are not batched. ``claim``: the architecture is claimed for the compiler first."""
        cache = mask = None
        for length in lengths:
            out = self.forward_prompt(self._tokens(1, length, token), None, self.new_cache())
            if not kv.batchable(out.past_key_values):
                return None
            if claim and cache is None:
                claim_architecture(self.model)  # before anything is compiled for it
            own = torch.ones(1, length, dtype=torch.long, device=self.device)
            cache, mask = (out.past_key_values, own) if cache is None else kv.join(cache, mask, out.past_key_values, own)
        return cache, mask

    def _step(self, cache, mask: torch.Tensor, read: dict | None, token: int):
        rows = mask.shape[0]
        positions = mask.sum(dim=1, keepdim=True)
        mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long, device=self.device)], dim=1)
        return self.decode(self._tokens(rows, 1, token), positions, mask, read, cache).past_key_values, mask

    def _tokens(self, rows: int, length: int, token: int) -> torch.Tensor:
        return torch.full((rows, length), token, dtype=torch.long, device=self.device)


def fused_decoder(model: MemTForCausalLM):
    """The family's decode step in fewer launches (``Family.decode_step``) for ``model``, or None where it has none
    or it does not fit this model."""
    from memt_core.families.base import resolve

    reference = model.checkpoint.family.decode_step
    if reference is None:
        return None
    step = resolve(reference)
    return step(model) if step.supports(model) else None
