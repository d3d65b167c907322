"""Ranks as processes: rank 0 serves (HTTP, the protocol, the scheduler) and every rank runs the same runner calls.

As in nano-vllm, rank 0 calls a model-runner method and the other ranks replay it: ``RankDriver`` stands where the
engine's ``ModelRunner`` stands, and each call (the method's name and its arguments: a step record, a memory handle,
a whole memory state to split) is broadcast once (``broadcast_object_list``) and then run on rank 0's own runner;
``serve`` is the other ranks' loop. One lock orders the calls, so every rank sees them in the same order and their
collectives meet. The memory effects the server's event loop makes (a fork pinning a query's memory, a state put
in place) need no collective: rank 0 makes them at once and the other ranks with the next call, before it (a step
that reads them, a gather), so the event loop never waits for a step in flight.

``start`` launches ranks 1 … N-1 as ``python -m memt_core.parallel.worker`` processes (CUDA: device ``cuda:r``; CPU:
all on this machine, gloo), joins the group as rank 0 and builds rank 0's share. ``RankDriver.watch`` polls them:
a rank that exits makes the engine fail every request (the server answers 503) and, after ``GRACE_S``, the server
process exit with ``EXIT_DEAD_RANK``; never a hang, never an answer from part of the model. ``stop`` ends every rank.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import torch.distributed as dist

from memt_core.errors import CheckpointError
from memt_core.parallel.group import RankGroup, free_address
from memt_core.parallel.plan import Parallel

log = logging.getLogger("memt.ranks")

#: seconds between a rank's death and the server's exit: /health and requests answer 503 meanwhile
GRACE_S = 2.0
#: the server's exit status when a rank died
EXIT_DEAD_RANK = 3
#: how often the ranks' processes are polled
POLL_S = 0.2


class RankDriver:
    """Rank 0's model runner: each call reaches every rank's runner, in one order."""

    def __init__(self, runner, group: RankGroup, processes: list[subprocess.Popen]):
        self.runner, self.group, self.processes = runner, group, processes
        self._lock = threading.Lock()  # one call at a time reaches the ranks
        self._pending_lock = threading.Lock()
        self._pending: list[tuple[str, tuple]] = []  # memory operations made here, sent with the next call
        self._stopped = False

    def __getattr__(self, name: str) -> Any:  # what the scheduler reads (device, model, graphs, compile_done, …)
        return getattr(self.runner, name)

    def _send(self, name: str, args: tuple) -> None:
        """Broadcast one call, the memory operations made since the last one first (``self._lock`` held)."""
        with self._pending_lock:
            operations, self._pending = self._pending, []
        dist.broadcast_object_list([(operations, name, args)], src=0, group=self.group.calls)

    def _call(self, name: str, *args):
        with self._lock:
            self._send(name, args)
            return getattr(self.runner, name)(*args)

    def _defer(self, name: str, *args) -> None:
        """A memory operation made here now (rank 0 reads it at once) and on the other ranks before the next call."""
        with self._pending_lock:
            getattr(self.runner, name)(*args)
            self._pending.append((name, args))

    def execute(self, step):
        return self._call("execute", step)

    def put_memory(self, handle: int, state) -> None:
        self._defer("put_memory", handle, state.to("cpu"))

    def fork_memory(self, source: int, handle: int) -> None:
        self._defer("fork_memory", source, handle)

    def memory(self, handle):
        """The whole state (every rank's heads gathered)."""
        return self._call("gather_memory", handle)

    def compile(self) -> None:
        self._call("compile")

    def make_pool(self, tokens: int) -> None:
        self._call("make_pool", tokens)

    def warm(self, plan, progress: Callable[[dict], None], stopping: Callable[[], bool]) -> None:
        with self._lock:  # every rank runs the whole plan: a warm-up stopped on one rank alone would leave collectives unmet
            self._send("warm", (plan,))
            self.runner.warm(plan, progress, lambda: False)

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Poll the ranks' processes; when one exits, ``on_death(reason)`` then, after ``GRACE_S``, exit this process."""

        def poll():
            while not self._stopped:
                for rank, process in enumerate(self.processes, start=1):
                    code = process.poll()
                    if code is not None and not self._stopped:
                        reason = f"rank {rank} of {self.group.world} exited with status {code}"
                        log.error("%s: the server stops (a model missing a rank's share cannot answer)", reason)
                        on_death(reason)
                        time.sleep(GRACE_S)
                        for other in self.processes:
                            if other.poll() is None:
                                other.kill()
                        os._exit(EXIT_DEAD_RANK)
                time.sleep(POLL_S)

        threading.Thread(target=poll, name="memt-ranks", daemon=True).start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End every rank: a last call tells them to leave, then their processes are waited for (killed if late)."""
        if self._stopped:
            return
        self._stopped = True
        told = True
        try:
            with self._lock:
                self._send("stop", ())
        except Exception:  # a rank already gone: the processes are ended below
            log.warning("could not tell every rank to stop", exc_info=True)
            told = False
        if told:
            RankGroup.leave()
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
        if not told:
            RankGroup.leave(together=False)


def serve(runner, group: RankGroup) -> None:
    """Ranks 1 … N-1: replay rank 0's runner calls (on ``group.calls``, which waits as long as the server idles)
    until it says stop."""
    while True:
        call = [None]
        dist.broadcast_object_list(call, src=0, group=group.calls)
        operations, name, args = call[0]
        for operation, operation_args in operations:  # rank 0's memory operations since its last call, in order
            getattr(runner, operation)(*operation_args)
        if name == "stop":
            return
        if name == "warm":
            runner.warm(args[0], lambda progress: None, lambda: False)
            continue
        getattr(runner, name)(*args)


def start(checkpoint, parallel: Parallel, *, device: str, dtype: str, runner_options: dict, deterministic: bool = False,
          threads: int | None = None):
    """Launch ranks 1 … N-1, join the group as rank 0 and build its share: (rank 0's model, the group, the processes)."""
    import json

    from memt_core.parallel.shard import build_rank_model

    address = free_address()
    backend = parallel.backend_for(device)
    spec = json.dumps({"checkpoint": str(checkpoint.path), "parallel": vars_of(parallel), "device": device, "dtype": dtype,
                       "runner": runner_options, "deterministic": deterministic, "threads": threads,
                       "address": address, "backend": backend})
    processes = [subprocess.Popen([sys.executable, "-m", "memt_core.parallel.worker", str(rank), spec])
                 for rank in range(1, parallel.world)]
    try:
        try:
            group = RankGroup.join(0, parallel.world, backend=backend, address=address, deterministic=deterministic)
        except Exception as exc:  # torch.distributed's errors, mapped where they enter
            dead = [f"rank {rank}: status {p.poll()}" for rank, p in enumerate(processes, start=1) if p.poll() is not None]
            raise CheckpointError(f"the {parallel.world} ranks could not meet over {backend} at {address} "
                                  f"({'; '.join(dead) or type(exc).__name__})") from exc
        model = build_rank_model(checkpoint, parallel, group, device=parallel.device_of(0, device), dtype=_dtype(dtype))
    except BaseException:
        for process in processes:
            process.kill()
        raise
    return model, group, processes


def vars_of(parallel: Parallel) -> dict:
    return {"tp": parallel.tp, "ep": parallel.ep, "dp": parallel.dp, "dp_attention": parallel.dp_attention, "backend": parallel.backend}


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]
