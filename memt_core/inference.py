"""The in-process API: load a checkpoint, keep session memory, commit tokens and generate.

This is the layer the engine, the examples and the demo model's training build on. A *commit* is one
forward pass over its tokens reading the memory as it was before the commit, then the collected
(k, v, α, β) are folded into a new memory in write events of ``chunk_tokens`` tokens. A *query*
reads a fixed memory and never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from memt_core.checkpoint import Checkpoint, read_checkpoint
from memt_core.memory.gated_delta import gated_delta_write
from memt_core.memory.snapshot import load_snapshot, save_snapshot
from memt_core.memory.state import MemoryState
from memt_core.models.memory import WriteInputs
from memt_core.models.memt import MemTForCausalLM
from memt_core.sampling import Sampler, SamplingParams


@dataclass
class CommitResult:
    """The memory after a commit, and how it was made."""

    memory: MemoryState
    tokens: int
    write_events: int
    read_snapshots: int
    logits: torch.Tensor | None = None  # [tokens, vocab], only when asked for (training)


@dataclass
class Generation:
    """A finished generation: the new token ids and why it stopped (``"stop"`` or ``"length"``)."""

    output_ids: list[int]
    finish_reason: str
    matched_stop: int | None = None


def memory_batch(model: MemTForCausalLM, states: Sequence[MemoryState | None]) -> dict[int, torch.Tensor] | None:
    """Per memory layer, the rows' states stacked to ``[B, H, K, V]``; ``None`` if no row reads anything."""
    if all(state is None or state.is_empty for state in states):
        return None
    shape = model.checkpoint.memory.state_shape()
    device = next(model.parameters()).device
    zeros = torch.zeros(shape, device=device)
    batch = {}
    for layer in model.memory_layers:
        rows = []
        for state in states:
            tensor = None if state is None else state.get(layer)
            rows.append(zeros if tensor is None else tensor.to(device))
        batch[layer] = torch.cat(rows, dim=0)
    return batch


def commit_tokens(
    model: MemTForCausalLM,
    memory: MemoryState,
    token_ids: Sequence[int] | torch.Tensor,
    *,
    chunk_tokens: int | None = None,
    keep_logits: bool = False,
) -> CommitResult:
    """Write ``token_ids`` into a fork of ``memory``; the input memory is left unchanged.

    Runs under the caller's grad mode, so training can backpropagate through the write.
    """
    return commit_batch(model, [memory], [token_ids], chunk_tokens=chunk_tokens, keep_logits=keep_logits)[0]


def commit_batch(
    model: MemTForCausalLM,
    memories: Sequence[MemoryState],
    token_lists: Sequence[Sequence[int] | torch.Tensor],
    *,
    chunk_tokens: int | None = None,
    keep_logits: bool = False,
) -> list[CommitResult]:
    """Commit several token lists at once, each into a fork of its own memory.

    Rows are right-padded to one length; padded positions write nothing (k = v = β = 0, α = 1) and,
    the backbone being causal, do not change what real tokens see. Each row reads its own memory as
    it was before the commit (one read snapshot per commit) and writes in events of ``chunk_tokens``.
    ``keep_logits`` also returns each row's logits over its tokens (the same forward pass; for training,
    where they are the logits a query over the same tokens and memory would have produced).
    """
    if len(memories) != len(token_lists):
        raise ValueError("one memory per token list")
    chunk = chunk_tokens or model.checkpoint.memory.chunk_tokens
    device = next(model.parameters()).device
    rows = [torch.as_tensor(ids, dtype=torch.long).reshape(-1) for ids in token_lists]
    lengths = [row.numel() for row in rows]
    if min(lengths) == 0:
        raise ValueError("a commit needs at least one token")
    longest = max(lengths)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : row.numel()] = row
    ids = ids.to(device)
    mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).to(device)  # [B, T]
    read = memory_batch(model, list(memories))  # the one read snapshot of each commit
    out = model(ids, memory=read, collect_writes=True, logits_to_keep=0 if keep_logits else 1)
    # a row's logits over its own tokens: one gather and a split, so backward stays linear in the batch
    row_logits = out.logits[mask].split(lengths) if keep_logits else [None] * len(rows)
    candidates = [m.fork() for m in memories]
    # all memory layers share one geometry: fold them into the batch so each write event is one kernel call
    layers = list(out.writes)
    inputs = WriteInputs.cat([out.writes[layer].masked(mask) for layer in layers])
    state = torch.cat([_stacked(model, [c.get(layer) for c in candidates], device) for layer in layers], dim=0)
    for start in range(0, longest, chunk):
        state = _write(inputs.slice(start, start + chunk), state)
    for j, layer in enumerate(layers):
        for i, candidate in enumerate(candidates):
            row = j * len(candidates) + i
            candidate.set(layer, state[row : row + 1])
    return [
        CommitResult(
            memory=candidate,
            tokens=length,
            write_events=-(-length // chunk),
            read_snapshots=1,
            logits=logits,
        )
        for candidate, length, logits in zip(candidates, lengths, row_logits)
    ]


def _stacked(model: MemTForCausalLM, tensors: list[torch.Tensor | None], device) -> torch.Tensor:
    shape = model.checkpoint.memory.state_shape()
    return torch.cat([torch.zeros(shape, device=device) if t is None else t.to(device) for t in tensors], dim=0)


def _write(piece, state):
    return gated_delta_write(piece.k, piece.v, piece.g, piece.beta, state)


def eos_token_ids(model: MemTForCausalLM) -> set[int]:
    """The model's end-of-sequence token ids, from its backbone configuration."""
    eos = model.config.eos_token_id
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)


@torch.no_grad()
def stream_generate(
    model: MemTForCausalLM,
    token_ids: Sequence[int],
    *,
    memory: MemoryState | None,
    params: SamplingParams,
    stop_ids: set[int] | None = None,
) -> Iterator[tuple[int, str | None]]:
    """Yield ``(token_id, finish_reason)`` one token at a time; the last has ``"stop"`` or ``"length"``.

    One request alone (the engine batches many); ``memory`` is read, never changed.
    """
    from transformers import DynamicCache

    stop = (stop_ids if stop_ids is not None else eos_token_ids(model)) | set(params.stop_token_ids)
    if params.max_new_tokens == 0:
        return
    device = next(model.parameters()).device
    read = memory_batch(model, [memory])
    cache = DynamicCache(config=model.config)
    sampler = Sampler(params)
    ids = torch.as_tensor(list(token_ids), dtype=torch.long, device=device).reshape(1, -1)
    for produced in range(params.max_new_tokens):
        out = model(ids, memory=read, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        token = sampler(out.logits[0, -1])
        if token in stop and not params.skip_eos:
            yield token, "stop"
            return
        if produced + 1 == params.max_new_tokens:
            yield token, "length"
            return
        yield token, None
        ids = torch.tensor([[token]], device=device)


def generate(model, token_ids, *, memory, params, stop_ids=None) -> Generation:
    """Run ``stream_generate`` to the end."""
    output, reason, matched = [], "length", None
    for token, finish in stream_generate(model, token_ids, memory=memory, params=params, stop_ids=stop_ids):
        output.append(token)
        if finish is not None:
            reason = finish
            matched = token if finish == "stop" else None
    return Generation(output_ids=output, finish_reason=reason, matched_stop=matched)


class LocalSession:
    """One memory session held in this process: commit, generate, save, load, reset."""

    def __init__(self, runtime: "MemTRuntime"):
        self.runtime = runtime
        self.memory = MemoryState()
        self.memory_read = True

    def commit(self, token_ids: Sequence[int]) -> CommitResult:
        with torch.no_grad():
            result = commit_tokens(self.runtime.model, self.memory, token_ids)
        self.memory = result.memory
        return result

    def generate(self, token_ids: Sequence[int], params: SamplingParams | None = None, *, read_memory: bool | None = None) -> Generation:
        read = self.memory_read if read_memory is None else read_memory
        return generate(
            self.runtime.model, token_ids, memory=self.memory if read else None, params=params or SamplingParams()
        )

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        return save_snapshot(path, self.memory, identity=self.runtime.identity, overwrite=overwrite)

    def load(self, path: str | Path) -> None:
        memory = self.runtime.checkpoint.memory
        self.memory = load_snapshot(
            path, identity=self.runtime.identity, layers=memory.memory_layers, shape=memory.state_shape()
        ).to(self.runtime.device)

    def reset(self) -> None:
        self.memory = MemoryState()


class MemTRuntime:
    """A loaded MemT checkpoint for in-process use (no server)."""

    def __init__(self, model: MemTForCausalLM):
        self.model = model
        self.checkpoint: Checkpoint = model.checkpoint
        self.identity = self.checkpoint.identity()
        self.device = next(model.parameters()).device

    @classmethod
    def load(cls, path: str | Path, *, device: str = "cpu", dtype: torch.dtype | None = None) -> "MemTRuntime":
        from memt_core.models.weights import load_model

        return cls(load_model(read_checkpoint(path), device=device, dtype=dtype))

    def open_session(self) -> LocalSession:
        return LocalSession(self)
