"""DP attention (``--enable-dp-attention``, Flash as the seed serves it): each rank runs attention and latent memory
for its own sessions, whole; the MLP blocks (routed experts split by EP, shared experts by TP) serve every rank's
tokens together.

How the ranks meet. Ranks run different work in a step (their own prefills, decodes and commits), so their forward
passes do not line up one to one. They meet at the MLP blocks instead, in rounds (``Exchange``): in each round every
rank says which block it is at and how many tokens it brings (or that it is idle), the tokens (and, for
DeepSeek-V4's hash-routed layers, their ids) are gathered, every rank runs its share of each requester's block on
that requester's tokens, and one all-reduce sums the shares, each rank keeping its own rows. A rank whose part of the
step is done keeps joining rounds as idle (``drain``: SGLang's "idle forward", here only the MLP blocks, where the
collectives are) until every rank is idle, so no collective waits for a rank that has nothing to send.

``DataParallelRunner`` is every rank's runner: it executes its own rank's part of a step, drains, and gathers the
results on rank 0; memory operations apply on the rank that holds the handle. ``DataParallelDriver`` stands on rank 0
where the scheduler expects its runner: it splits each step by ``memt_core.parallel.owners.Owners``, copies a memory
that must move first, and merges the ranks' results into one.
"""

from __future__ import annotations

import torch
from torch import nn

from memt_core.memory.state import MemoryState
from memt_core.parallel.group import RankGroup
from memt_core.parallel.owners import Owners

IDLE = -1  # a rank's block index when it brings no tokens


class Exchange:
    """The MLP blocks of one rank's model, and the rounds in which the ranks run them on each other's tokens."""

    def __init__(self, group: RankGroup, blocks: dict[int, nn.Module], hidden: int, *, device, dtype: torch.dtype):
        self.group, self.blocks, self.hidden = group, blocks, hidden
        self.device, self.dtype = torch.device(device), dtype
        self.rounds = 0  # rounds that carried tokens (a bench counts them)

    def run(self, block: int, rows: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """Block ``block``'s output for this rank's ``rows`` ``[n, hidden]`` (``ids``: their token ids, or None)."""
        out = self._round(block, rows, ids)
        assert out is not None
        return out

    def drain(self) -> None:
        """Join rounds as idle until every rank is idle."""
        while self._round(IDLE, None, None) is not None:
            pass

    def _round(self, block: int, rows: torch.Tensor | None, ids: torch.Tensor | None) -> torch.Tensor | None:
        count = 0 if rows is None else rows.shape[0]
        header = torch.tensor([block, count, int(ids is not None)], dtype=torch.long, device=self.device)
        heads = [part.tolist() for part in self.group.all_gather(header)]
        if all(head[0] == IDLE for head in heads):
            return None
        self.rounds += 1
        widest = max(head[1] for head in heads)
        padded = torch.zeros(widest, self.hidden, dtype=self.dtype if rows is None else rows.dtype, device=self.device)
        if count:
            padded[:count] = rows
        tokens = self.group.all_gather(padded)
        token_ids = None
        if any(head[2] for head in heads):
            padded_ids = torch.zeros(widest, dtype=torch.long, device=self.device)
            if ids is not None and count:
                padded_ids[:count] = ids
            token_ids = self.group.all_gather(padded_ids)
        shares = []
        for rank, (their_block, their_count, has_ids) in enumerate(heads):
            if their_count == 0:
                continue
            kwargs = {"input_ids": token_ids[rank][:their_count].unsqueeze(0)} if has_ids else {}
            share = self.blocks[their_block](tokens[rank][:their_count].unsqueeze(0), **kwargs)
            shares.append(share.reshape(their_count, self.hidden))
        if not shares:
            return padded[:0]
        total = self.group.all_reduce(torch.cat(shares))
        start = sum(head[1] for head in heads[:self.group.rank])
        return total[start:start + count]


class DataParallelMLP(nn.Module):
    """A decoder layer's MLP block under DP attention: this rank's tokens go through ``Exchange``."""

    def __init__(self, block: nn.Module, index: int, exchange: Exchange):
        super().__init__()
        self.block, self.index, self.exchange = block, index, exchange

    def forward(self, hidden_states: torch.Tensor, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        shape = hidden_states.shape
        rows = hidden_states.reshape(-1, shape[-1])
        ids = input_ids.reshape(-1) if input_ids is not None else None
        return self.exchange.run(self.index, rows, ids).view(shape)


def attach(model, group: RankGroup) -> Exchange:
    """Put every decoder layer's MLP block of ``model`` (a rank's share) behind one ``Exchange``; returns it."""
    layers = model.backbone.model.layers
    blocks = {i: layer.mlp for i, layer in enumerate(layers) if getattr(layer, "mlp", None) is not None}
    weight = next(model.parameters())
    exchange = Exchange(group, blocks, model.config.hidden_size, device=weight.device, dtype=weight.dtype)
    for i, block in blocks.items():
        layers[i].mlp = DataParallelMLP(block, i, exchange)
    return exchange


class DataParallelRunner:
    """Every rank's runner under DP attention: its own part of each step, then idle rounds, results gathered on rank 0."""

    def __init__(self, runner, group: RankGroup, exchange: Exchange):
        self.runner, self.group, self.exchange = runner, group, exchange

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    def execute(self, parts):
        try:
            result = self.runner.execute(parts[self.group.rank])
        finally:
            self.exchange.drain()
        results = self.group.gather_objects(result)
        if results is None:
            return None
        for other in results[1:]:  # logits made on another device come to rank 0's
            for block in other.decoded:
                block.values = block.values.to(self.runner.device)
            other.prefilled = {request: value.to(self.runner.device) if isinstance(value, torch.Tensor) else value
                               for request, value in other.prefilled.items()}
        return results

    def put_memory(self, handle: int, state: MemoryState, owner: int) -> None:
        if owner == self.group.rank:
            self.runner.put_memory(handle, state)

    def fork_memory(self, source: int, handle: int) -> None:
        if source in self.runner.memories:  # the source's rank: the fork stays beside it
            self.runner.fork_memory(source, handle)

    def gather_memory(self, handle: int | None, owner: int | None) -> MemoryState:
        """The state on rank ``owner``, on every rank."""
        if handle is None or owner is None:
            return MemoryState()
        state = self.runner.memory(handle).to("cpu") if owner == self.group.rank else None
        return self.group.broadcast_object(state, owner).to(self.runner.device)

    def move_memory(self, handle: int, source: int, target: int) -> None:
        """Copy memory ``handle`` from rank ``source`` to rank ``target``, letting it go on ``source``."""
        state = self.gather_memory(handle, source)
        if self.group.rank == source:
            self.runner.drop_memory(handle)
        if self.group.rank == target:
            self.runner.put_memory(handle, state)

    def warm(self, plan, progress, stopping) -> None:
        try:
            self.runner.warm(plan, progress, stopping)
        finally:
            self.exchange.drain()


class DataParallelDriver:
    """Rank 0's runner under DP attention, over ``RankDriver`` (``memt_core.parallel.ranks``): steps split by where
    each handle lives, and merged back."""

    def __init__(self, driver, ranks: int):
        self.driver = driver
        self.owners = Owners(ranks)

    def __getattr__(self, name: str):
        return getattr(self.driver, name)

    def execute(self, step):
        parts, moves = self.owners.split(step)
        for move in moves:
            self.driver._call("move_memory", move.handle, move.source, move.target)
        results = self.driver._call("execute", parts)
        return self.owners.merge(step, parts, results)

    def put_memory(self, handle: int, state: MemoryState) -> None:
        self.driver._defer("put_memory", handle, state.to("cpu"), self.owners.place(handle))

    def fork_memory(self, source: int, handle: int) -> None:
        self.owners.place(handle, near=source)
        self.driver._defer("fork_memory", source, handle)

    def memory(self, handle: int | None) -> MemoryState:
        return self.driver._call("gather_memory", handle, self.owners.of(handle) if handle is not None else None)


def rank_runner(model, group: RankGroup, **options):
    """A rank's runner for its share ``model``: the model runner, under DP attention wrapped to take its part of each step."""
    from memt_core.engine.runner import ModelRunner

    runner = ModelRunner(model, **options)
    exchange = getattr(model, "exchange", None)
    return runner if exchange is None else DataParallelRunner(runner, group, exchange)
