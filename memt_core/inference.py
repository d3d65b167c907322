"""The in-process API: load a checkpoint, keep session memory, commit tokens and generate.

This is the layer the examples and the demo model's training build on; the engine shares its model
passes (:mod:`memt_core.models.passes`). A *commit* is one forward pass over its tokens reading the memory as it was before the commit, then the collected
(k, v, α, β) are folded into a new memory in write events of ``chunk_tokens`` tokens. A *query*
reads a fixed memory and never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from memt_core.checkpoint import Checkpoint, read_checkpoint
from memt_core.memory.snapshot import load_snapshot, save_snapshot
from memt_core.memory.state import MemoryState
from memt_core.models.memt import MemTForCausalLM
from memt_core.models.passes import CommitResult, commit_batch, commit_tokens, eos_token_ids, memory_batch  # noqa: F401 (public API)
from memt_core.sampling import Sampler, SamplingParams


@dataclass
class Generation:
    """A finished generation: the new token ids and why it stopped (``"stop"`` or ``"length"``)."""

    output_ids: list[int]
    finish_reason: str
    matched_stop: int | None = None


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
    sampler = Sampler(params, prompt=tuple(token_ids), end_ids=frozenset(stop))
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
