#!/usr/bin/env python
"""Operator launches per decode step, counted with the torch profiler on the CPU: what a GPU pays per step.

A decode step at small batch sizes is bound by launching kernels, not by arithmetic or memory bandwidth (on an
H200 the Nano-widths checkpoint decoded at 1 % of its bandwidth bound, issue 46). Each operator that computes
is one kernel launch on a GPU; the CPU runs the same operators, so counting them here is a deterministic,
machine-independent measure that needs no GPU. The step is the engine's own (``TorchEngine._step``: the
model's forward pass over the shared batch and the sampling of every row), driven in this thread.

Counted, per step, from the profiler's operator tree:

* **launches** — the outermost operators that compute and are not compositions of other operators (on a GPU:
  a kernel each, whatever their CPU implementation calls: ``_grouped_mm`` counts once); compositions
  (``linear``, ``matmul``, ``einsum``, …, torch's ``CompositeImplicitAutograd``) count as what they call, and
  operators that only make views or read metadata (``view``, ``transpose``, ``slice``, ``empty``, …) not at all;
* **operators** — every operator the dispatcher ran, those and the ones called inside others included
  (the host's cost per step);
* **host syncs** — operators that make a GPU wait for the host to learn a value (``item``/``int()``
  as ``_local_scalar_dense``, ``nonzero``, ``unique``, …). A ``.tolist()`` or ``.cpu()`` copies nothing on the
  CPU and is not seen here.

Without ``--model-path`` the model is a random Nano at the released model's widths (``--widths nano``;
``--layers 4 --experts 32``: three linear-attention layers, then one full-attention layer with memory) built
in memory, no files. Each row reads a session memory (random), as a memory turn does.

    python scripts/bench/launches.py                    # Nano widths, batches of 1 and 16
    python scripts/bench/launches.py --widths tiny --rows 1,4 --top 20
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

#: Launches per decode step before issue 46's changes (commit 5b3430e: transformers' grouped_mm experts,
#: its PyTorch reference of the causal convolution and the gated delta rule, a sampler per row), Nano
#: widths, 4 layers, 32 experts, FP32 on the CPU, every row reading a memory. Target: at most a quarter.
BEFORE = {1: 406, 16: 421}
TARGET_FRACTION = 0.25

#: Leaf operators that launch no kernel: views, metadata, allocation without initialisation.
NO_KERNEL = frozenset(
    "aten::" + name
    for name in (
        "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand", "expand_as",
        "unsqueeze", "squeeze", "slice", "select", "as_strided", "alias", "detach", "unbind", "split",
        "split_with_sizes", "chunk", "narrow", "empty", "empty_strided", "empty_like", "new_empty",
        "new_empty_strided", "to", "contiguous", "lift_fresh", "resolve_conj", "resolve_neg", "view_as",
        "unflatten", "flatten", "numpy_T", "movedim", "diagonal", "swapaxes", "result_type", "is_nonzero",
        "size", "stride", "dim", "_has_compatible_shallow_copy_type", "set_", "resize_", "is_same_size",
        "_local_scalar_dense", "item", "values", "indices", "_nested_tensor_from_mask_left_aligned", "align_to",
        "refine_names", "rename", "matrix_H", "mT", "mH", "T", "H", "real", "imag", "conj", "_conj",
        "_neg_view", "lift", "lift_fresh_copy_", "detach_", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    )
)
#: Leaf operators after which a GPU's host must wait for the device (they return host values or sizes).
HOST_SYNCS = frozenset(
    "aten::" + name
    for name in ("_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "unique", "_unique", "_unique2",
                 "unique_consecutive", "unique_dim", "bincount", "equal", "allclose", "is_nonzero")
)


#: Operators that are compositions on the CPU but one kernel of their own on a GPU (torch's CUDA build registers it).
GPU_KERNELS = frozenset({"aten::_fused_rms_norm"})


@dataclass
class StepCount:
    """What one decode step ran."""

    launches: int
    operators: int
    host_syncs: int
    by_name: collections.Counter = field(default_factory=collections.Counter)


def count_ops(run) -> StepCount:
    """Profile ``run()`` on the CPU and count its operators (``StepCount``)."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    count = StepCount(0, 0, 0)

    def operators(event) -> int:
        return 1 + sum(operators(child) for child in event.cpu_children if is_operator(child))

    def visit(event) -> int:
        """Launches in ``event``'s subtree; counts its host syncs and operators on the way."""
        if composite(event.name) and event.name not in GPU_KERNELS:  # a composition of other operators: they are the kernels
            count.operators += 1
            return sum(visit(child) for child in event.cpu_children if is_operator(child))
        count.operators += operators(event)  # what its CPU implementation calls is its own business
        if event.name in HOST_SYNCS:
            count.host_syncs += 1
        if event.name in NO_KERNEL:
            return 0
        count.by_name[event.name] += 1
        return 1  # one kernel

    roots = [event for event in prof.events() if is_operator(event) and not _under_operator(event)]
    count.launches = sum(visit(event) for event in roots)
    return count


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's own start/stop lines (written to the process's stderr by its C++ side) left out."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@functools.cache
def composite(name: str) -> bool:
    """Whether operator ``name`` (any overload) is implemented by calling other operators on every backend
    (``CompositeImplicitAutograd``: ``linear``, ``matmul``, ``einsum``, ``softmax``, ``to``, …)."""
    namespace, _, op = name.partition("::")
    packet = getattr(getattr(torch.ops, namespace, None), op, None)
    if packet is None:
        return False
    for overload in packet.overloads():
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(name if overload == "default" else f"{name}.{overload}",
                                                              "CompositeImplicitAutograd"):
                return True
        except RuntimeError:  # an overload of lists or scalars, outside the dispatcher
            continue
    return False


def is_operator(event) -> bool:
    """An operator's event (``aten::…``, ``transformers::…``), not a user scope."""
    return "::" in event.name and not event.name.startswith(("autograd::", "## "))


def _under_operator(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if is_operator(parent):
            return True
        parent = parent.cpu_parent
    return False


class Driver:
    """A ``TorchEngine`` driven step by step in this thread (its worker thread is never started)."""

    def __init__(self, model, rows: int, prompt_tokens: int, seed: int = 0):
        from memt_core.engine import TorchEngine

        self.model, self.rows, self.prompt_tokens, self.seed = model, rows, prompt_tokens, seed
        self.engine = TorchEngine(model, max_running_requests=rows, max_commit_batch=1)
        self.engine._check_alive = lambda: None  # its work runs here, not on the worker thread
        self.loop = asyncio.new_event_loop()
        self.streams = []

    def start(self, new_tokens: int) -> None:
        """``rows`` sessions with a random memory each, one greedy query each, prefilled: the batch decodes next."""
        from memt_core.memory.state import MemoryState
        from memt_core.protocol import effects as fx
        from memt_core.sampling import SamplingParams

        generator = torch.Generator().manual_seed(self.seed)
        shape = self.model.checkpoint.memory.state_shape()
        vocab = self.model.config.vocab_size
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0, skip_eos=True)

        async def open_all():
            for i in range(self.rows):
                name = f"s{i}"
                await self.engine.apply(fx.NewMemory(name))
                handle = self.engine.handles.new()
                self.engine.runner.put_memory(handle, MemoryState({layer: torch.randn(shape, generator=generator) * 0.1
                                                                   for layer in self.model.memory_layers}))
                self.engine.store.get(name).published = handle
                prompt = torch.randint(10, vocab, (self.prompt_tokens,), generator=generator).tolist()
                self.streams.append(self.engine.query(f"r{i}", prompt, params, session=name))

        self.loop.run_until_complete(open_all())
        torch.set_grad_enabled(False)
        self.engine._drain(block=False)
        self.step()  # the prompts' prefills: the rows join the batch at the next step
        assert len(self.engine._running) == self.rows, "every query runs"

    def step(self) -> None:
        """One iteration of the engine's loop: its step record written, run by the model runner, sampled."""
        record, commits, admitted = self.engine._schedule()
        self.engine._absorb(self.engine.runner.execute(record), commits, admitted)

    def close(self) -> None:
        torch.set_grad_enabled(True)
        self.loop.close()


def measure(model, rows: int, *, steps: int = 3, warmup: int = 2, prompt_tokens: int = 16) -> list[StepCount]:
    """Per decode step of a batch of ``rows`` (after ``warmup`` steps), what it ran; ``steps`` steps counted."""
    driver = Driver(model, rows, prompt_tokens)
    driver.start(new_tokens=1 + warmup + steps + 1)
    try:
        for _ in range(warmup):
            driver.step()
        return [count_ops(driver.step) for _ in range(steps)]
    finally:
        driver.close()


def build_model(args):
    """The bench's model: ``--model-path`` loaded, else a random one at ``--widths`` built in memory."""
    from memt_core.models.weights import load_model
    from memt_core.tiny import random_model, write_config

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.model_path:
        return load_model(args.model_path, dtype=dtype), args.model_path
    with tempfile.TemporaryDirectory(prefix="memt-launches-") as scratch:
        widths = None if args.widths == "tiny" else args.widths
        layers, experts = (None, None) if widths is None else (args.layers, args.experts)
        path = write_config(Path(scratch) / "config", "memt-nano", chunk_tokens=2048, widths=widths, layers=layers, experts=experts)
        model = random_model(path, dtype=dtype)
    described = f"random Nano, {args.widths} widths" + (f", {args.layers} layers, {args.experts} experts" if widths else "")
    return model, described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="a checkpoint to load (default: a random Nano built in memory)")
    parser.add_argument("--widths", default="nano", choices=["nano", "tiny"], help="widths of the random Nano (default nano)")
    parser.add_argument("--layers", type=int, default=4, help="layers at nano widths (default 4)")
    parser.add_argument("--experts", type=int, default=32, help="experts at nano widths (default 32)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="compute dtype (default float32, the CPU's)")
    parser.add_argument("--rows", default="1,16", help="decode batch sizes, comma-separated (default 1,16)")
    parser.add_argument("--steps", type=int, default=3, help="decode steps counted per batch size (default 3)")
    parser.add_argument("--top", type=int, default=12, help="most frequent launched operators to list (default 12; 0: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1; counts do not depend on it)")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows_list = [int(part) for part in args.rows.split(",") if part]

    started = time.monotonic()
    model, described = build_model(args)
    print(f"operator launches per decode step: {described}, {args.dtype} on the CPU, torch {torch.__version__}; "
          f"every row reads a memory (layers {list(model.memory_layers)}); built in {time.monotonic() - started:.0f} s")
    header = f"{'rows':>5}  {'launches':>9}  {'per row':>8}  {'operators':>10}  {'host syncs':>11}  {'before':>7}  {'now/before':>10}"
    print(header)
    print("-" * len(header))
    results = {}
    for rows in rows_list:
        counts = measure(model, rows, steps=args.steps)
        launches = [c.launches for c in counts]
        if len(set(launches)) != 1:
            print(f"  (rows {rows}: launches differ between steps: {launches}; the median is shown)")
        count = counts[len(counts) // 2]
        launched = int(statistics.median(launches))
        before = BEFORE.get(rows) if args.model_path is None and args.widths == "nano" and (args.layers, args.experts, args.dtype) == (4, 32, "float32") else None
        ratio = f"{launched / before:>9.2f}×" if before else f"{'–':>10}"
        print(f"{rows:>5}  {launched:>9,}  {launched / rows:>8,.1f}  {count.operators:>10,}  {count.host_syncs:>11,}  "
              f"{before or '–':>7}  {ratio}")
        results[rows] = {"launches": launched, "operators": count.operators, "host_syncs": count.host_syncs,
                         "before": before, "by_name": dict(count.by_name.most_common())}
        if args.top:
            common = ", ".join(f"{name.removeprefix('aten::')} {n}" for name, n in count.by_name.most_common(args.top))
            print(f"       most launched: {common}")
    comparable = [r for r in results.values() if r["before"]]
    if comparable:
        worst = max(r["launches"] / r["before"] for r in comparable)
        print(f"\ntarget: at most {TARGET_FRACTION:g} of the launches before issue 46: "
              f"{'met' if worst <= TARGET_FRACTION else 'NOT met'} (highest {worst:.2f}×)")
    if args.json:
        args.json.write_text(json.dumps({"model": described, "dtype": args.dtype, "torch": torch.__version__, "rows": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
