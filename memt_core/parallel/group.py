"""The ranks' collectives over torch.distributed: gloo on CPU processes, NCCL on GPUs, the same calls.

``RankGroup`` is what a sharded model and the runner use: a sum of every rank's partial product (``all_reduce``),
the vocabulary-parallel logits gathered along their last dimension (``gather_last``), and the bytes each sent, so a
bench can count what a decode step costs on the wire. With ``deterministic`` the sums are made in rank order:
every rank gathers the parts and adds them 0, 1, 2, … (the same bits on every run and every rank, whatever the
backend's reduction tree), at the price of a gather instead of a reduce.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Traffic:
    """What this rank sent: collectives and bytes (a ring all-reduce sends about twice its tensor, counted as such)."""

    collectives: int = 0
    bytes: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int) -> None:
        self.collectives += 1
        self.bytes += nbytes
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1


#: how long the other ranks may wait for rank 0's next call: a serving group idles while no request comes
IDLE_S = 365 * 24 * 3600.0


class RankGroup:
    """This process's place among the ranks, and their collectives."""

    def __init__(self, rank: int, world: int, *, deterministic: bool = False, calls=None):
        self.rank, self.world, self.deterministic = rank, world, deterministic
        self.traffic = Traffic()
        self.calls = calls  # the process group rank 0's calls travel on (see ``join``)

    @classmethod
    def join(cls, rank: int, world: int, *, backend: str, address: str, deterministic: bool = False,
             timeout_s: float = 60.0) -> "RankGroup":
        """Join the process group at ``address`` (``host:port`` of rank 0). ``timeout_s`` bounds the meeting and every
        collective of a step. Rank 0's calls travel on a group of their own (``calls``) without that bound: the other
        ranks wait there for the next call for as long as the server idles (a dead peer is noticed by its exit)."""
        from datetime import timedelta

        dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        calls = dist.new_group(timeout=timedelta(seconds=IDLE_S))
        return cls(rank, world, deterministic=deterministic, calls=calls)

    @classmethod
    @contextmanager
    def joined(cls, rank: int, world: int, **join):
        """``join``, then ``leave`` at the end of the block: together when it ended well, alone when it raised (a rank
        that lost a peer must not wait for it)."""
        group = cls.join(rank, world, **join)
        try:
            yield group
        except BaseException:
            cls.leave(together=False)
            raise
        cls.leave()

    @staticmethod
    def leave(*, together: bool = True) -> None:
        """Leave the group; ``together``: first wait for every rank to be leaving too (tearing gloo down while a peer
        still talks to it aborts the process), which a rank that lost a peer must not do."""
        if dist.is_initialized():
            if together:
                dist.barrier()
            dist.destroy_process_group()

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``tensor``, in place (and returned)."""
        if self.world == 1:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        if self.deterministic:
            parts = [torch.empty_like(tensor) for _ in range(self.world)]
            dist.all_gather(parts, tensor.contiguous())
            total = parts[0]
            for part in parts[1:]:
                total = total + part
            tensor.copy_(total)
            self.traffic.add("all_reduce", nbytes * (self.world - 1))
            return tensor
        dist.all_reduce(tensor)
        self.traffic.add("all_reduce", 2 * nbytes * (self.world - 1) // self.world)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (all of one shape), in rank order."""
        if self.world == 1:
            return [tensor]
        parts = [torch.empty_like(tensor) for _ in range(self.world)]
        dist.all_gather(parts, tensor.contiguous())
        self.traffic.add("all_gather", tensor.numel() * tensor.element_size() * (self.world - 1))
        return parts

    def gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` joined along the last dimension, rank 0's first (vocabulary-parallel logits)."""
        return self.gather_dim(tensor, -1)

    def gather_dim(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``tensor`` joined along ``dim`` (a memory state's heads, for a snapshot)."""
        if self.world == 1:
            return tensor
        return torch.cat(self.all_gather(tensor), dim=dim)

    def gather_objects(self, value) -> list | None:
        """Every rank's picklable ``value``, in rank order, on rank 0 (None on the others)."""
        if self.world == 1:
            return [value]
        values = [None] * self.world if self.rank == 0 else None
        dist.gather_object(value, values, dst=0)
        self.traffic.add("gather_object", 0)
        return values

    def broadcast_object(self, value, source: int):
        """Rank ``source``'s picklable ``value``, on every rank."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=source)
        self.traffic.add("broadcast_object", 0)
        return box[0]


def free_address() -> str:
    """A free loopback ``host:port`` for rank 0 to listen on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"

