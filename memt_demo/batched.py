"""The batched training loss: a batch's episodes committed together, one forward per commit index.

:func:`memt_demo.train.episode_loss` is the reference: it keeps a :class:`MemoryState` per episode and
runs each commit index through :func:`memt_core.inference.commit_batch` in groups of similar length, then
the loss row by row. :func:`batched_episode_loss` computes the same loss (same signature, same
:class:`StepStats`) with the memory of the whole batch in one tensor::

    state: [L, B, H, K, V]     L memory layers, B episodes (FP32; zeros for an episode nothing was written to)

    for depth d in 0 … max commits − 1:
        rows   = episodes with more than d commits                        (A of them; rows that ended are left out)
        ids    = their d-th commits, right-padded to one length T         [A, T], mask [A, T]
                 (on the CPU in a few groups of similar length: its cost is per token, padding included)
        out    = model(ids, memory=state[:, rows])                        one forward reading each row's memory
        writes = out.writes masked (padding writes nothing: k = v = β = 0, log α = 0), layers folded into the batch
        state[:, rows] ← write events of chunk_tokens over [L·A, T]       the engine's gated-delta kernel
    query: every episode's prompt + answer, padded, one forward reading state (in a few length groups)
    loss:  the weighted positions of every forward gathered, one output projection, one cross-entropy

It reuses the model's own passes (the memory hook reads ``[B, H, K, V]``, ``collect_writes`` returns the
per-token write inputs, :meth:`WriteInputs.masked` zeroes the padding) and writes with the same
:func:`~memt_core.memory.gated_delta.gated_delta_write` in the same write events as ``commit_batch``; what
differs from the reference is only the order of floating-point sums (padding length, batch composition,
one summed loss instead of per-row ones), so the two agree within float tolerance
(``tests/demo/test_batched_trainer.py``, losses and gradients).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch
import torch.nn.functional as F

from memt_core.memory.gated_delta import gated_delta_write
from memt_core.models.memory import WriteInputs
from memt_core.models.memt import MemTForCausalLM
from memt_demo.format import Segment, TokenEpisode
from memt_demo.loss import HiddenStates, StepStats

#: Commits of one index are padded in groups whose longest is at most this many times the shortest (+ 16
#: tokens): at batch 16 of the full mix, 1.15× the real tokens in ~1.7 forwards per commit index, where one
#: forward per index pads to 1.85× (the backbone's cost is per token, padding included).
COMMIT_SLACK = 1.5
#: Queries are padded in groups whose longest row is at most this many times the shortest (+ 16 tokens):
#: a handful of forwards instead of one that pads a 30-token question to a 300-token tool prompt.
QUERY_SLACK = 2.0


class _Targets:
    """The weighted positions of every forward of a step, gathered so the output projection runs once."""

    def __init__(self, device):
        self.device = device
        self.hidden: list[torch.Tensor] = []  # [N_i, D] hidden states that predict a weighted token
        self.targets: list[list[int]] = []
        self.weights: list[list[float]] = []

    def add(self, hidden: torch.Tensor, segments: Sequence[Segment]) -> None:
        """Gather ``hidden [A, T, D]``'s weighted positions, row by row, in order."""
        positions, targets, weights = [], [], []
        width = hidden.shape[1]
        for row, segment in enumerate(segments):
            for t, w in enumerate(segment.weights[1:]):  # the hidden state at t predicts token t + 1
                if w > 0:
                    positions.append(row * width + t)
                    targets.append(segment.ids[t + 1])
                    weights.append(w)
        if positions:
            index = torch.tensor(positions, device=hidden.device)
            self.hidden.append(hidden.reshape(-1, hidden.shape[-1]).index_select(0, index))
            self.targets.append(targets)
            self.weights.append(weights)

    def loss(self, head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Σ w·CE, Σ w, per position argmax correctness and weight (in the order added)."""
        if not self.hidden:
            zero = torch.zeros((), device=self.device)
            empty = torch.zeros(0, device=self.device)
            return zero, zero, empty.bool(), empty
        hidden = torch.cat(self.hidden)
        target = torch.tensor([t for part in self.targets for t in part], device=self.device)
        weight = torch.tensor([w for part in self.weights for w in part], device=self.device)
        logits = F.linear(hidden, head)
        total = (F.cross_entropy(logits.float(), target, reduction="none") * weight).sum()
        return total, weight.sum(), logits.argmax(-1) == target, weight


def _padded(segments: Sequence[Segment], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[A, T]`` and the mask of real tokens."""
    longest = max(len(s) for s in segments)
    ids = torch.full((len(segments), longest), pad, dtype=torch.long)
    for row, segment in enumerate(segments):
        ids[row, : len(segment)] = torch.tensor(segment.ids)
    lengths = torch.tensor([len(s) for s in segments])
    mask = torch.arange(longest)[None, :] < lengths[:, None]
    return ids.to(device), mask.to(device)


def _length_groups(lengths: list[int], slack: float | None) -> list[list[int]]:
    """Row indices in groups of similar length (ascending), each group's longest ≤ slack × its shortest + 16;
    ``slack=None``: one group."""
    if slack is None:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] <= slack * lengths[groups[-1][0]] + 16:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _write(writes: WriteInputs, state: torch.Tensor, chunk: int) -> torch.Tensor:
    """Fold ``writes`` ([N, T, H, ·]) into ``state`` [N, H, K, V] in write events of ``chunk`` tokens, as a commit does."""
    for start in range(0, writes.length, chunk):
        piece = writes.slice(start, start + chunk)
        state = gated_delta_write(piece.k, piece.v, piece.g, piece.beta, state)
    return state


def batched_episode_loss(model: MemTForCausalLM, batch: list[TokenEpisode], *, slack: float | None | str = "auto"):
    """The weighted mean CE of :func:`memt_demo.train.episode_loss`, computed a commit index at a time for the whole batch.

    ``slack``: at each commit index the rows are padded in groups of similar length (see :func:`_length_groups`);
    ``None`` pads them all to one length: one forward per commit index, more padding. ``"auto"``:
    :data:`COMMIT_SLACK` on the CPU, whose cost is per token, padding included; ``None`` on a GPU, where a
    small model's step is bound by the number of operations launched, not by their size.
    """
    device = next(model.parameters()).device
    if slack == "auto":
        slack = COMMIT_SLACK if device.type == "cpu" else None
    layers = list(model.memory_layers)
    chunk = model.checkpoint.memory.chunk_tokens
    pad = model.config.pad_token_id or 0
    size = len(batch)
    state: torch.Tensor | None = None  # [L, B, H, K, V]; None while nothing has been written
    targets = _Targets(device)
    tokens = 0

    def forward(rows: list[int], segments: list[Segment], *, commit: bool) -> torch.Tensor | None:
        """One forward over ``segments`` (of episodes ``rows``) reading their memory; a commit returns the
        memory after its write, ``[L, A, H, K, V]``."""
        ids, mask = _padded(segments, pad, device)
        before = None if state is None else state.index_select(1, torch.tensor(rows, device=device))
        read = None if before is None else {layer: before[j] for j, layer in enumerate(layers)}
        keep = any(w > 0 for s in segments for w in s.weights)
        out = model(ids, memory=read, collect_writes=commit, logits_to_keep=0 if keep else 1)
        if keep:
            targets.add(out.logits, segments)
        if not commit:
            return None
        writes = WriteInputs.cat([out.writes[layer].masked(mask) for layer in layers])  # layers folded: [L·A, T, H, ·]
        shape = model.checkpoint.memory.state_shape()[1:]
        start = torch.zeros(len(layers) * len(rows), *shape, device=device) if before is None else before.flatten(0, 1)
        return _write(writes, start, chunk).unflatten(0, (len(layers), len(rows)))

    with HiddenStates(model) as head:
        for depth in range(max((len(e.commits) for e in batch), default=0)):
            active = [i for i, e in enumerate(batch) if len(e.commits) > depth]
            groups = [[active[g] for g in group] for group in _length_groups([len(batch[i].commits[depth]) for i in active], slack)]
            written = [forward(group, [batch[i].commits[depth] for i in group], commit=True) for group in groups]
            rows = [i for group in groups for i in group]
            tokens += sum(len(batch[i].commits[depth]) for i in rows)
            after = torch.cat(written, dim=1)
            if state is None:
                state = torch.zeros(len(layers), size, *after.shape[2:], device=device)
            state = state.index_copy(1, torch.tensor(rows, device=device), after)  # out of place: autograd keeps the old state
        offset = sum(len(part) for part in targets.targets)  # the queries' weighted positions come after this
        groups = _length_groups([len(e.query) for e in batch], QUERY_SLACK)
        for group in groups:
            forward(group, [batch[i].query for i in group], commit=False)
            tokens += sum(len(batch[i].query) for i in group)
        total, weight_sum, correct, weight = targets.loss(head)
    exact: dict[str, list[bool]] = defaultdict(list)
    values: dict[str, list[bool]] = defaultdict(list)
    for i in (i for group in groups for i in group):  # the order the queries were added in
        count = sum(w > 0 for w in batch[i].query.weights[1:])
        row, w = correct[offset : offset + count], weight[offset : offset + count]
        offset += count
        exact[batch[i].kind].append(bool(row.all()))
        values[batch[i].kind] += row[w > 1.0].tolist()
    mean = total / weight_sum.clamp(min=1.0)
    return mean, StepStats(float(mean.detach()), tokens, exact, values)
