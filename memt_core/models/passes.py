"""Forward passes of a MemT model over session memory: batched commits and stacked read snapshots.

The engine and the in-process API both run these; they are the one place a commit's read → collect →
write-events sequence is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from memt_core.memory.gated_delta import gated_delta_write
from memt_core.memory.state import MemoryState
from memt_core.models.memory import WriteInputs
from memt_core.models.memt import MemTForCausalLM


@dataclass
class CommitResult:
    """The memory after a commit, and how it was made."""

    memory: MemoryState
    tokens: int
    write_events: int
    read_snapshots: int
    logits: torch.Tensor | None = None  # [tokens, vocab], only when asked for (training)


def memory_batch(model: MemTForCausalLM, states: Sequence[MemoryState | None], *, zeros: bool = False) -> dict[int, torch.Tensor] | None:
    """Per memory layer, the rows' states stacked to ``[B, H, K, V]``; ``None`` if no row reads anything,
    unless ``zeros`` (then all-zero states, which add exactly nothing: the read has no bias)."""
    if not zeros and all(state is None or state.is_empty for state in states):
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
