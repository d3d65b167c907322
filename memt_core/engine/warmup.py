"""What the torch engine runs before it reports ready: the shapes it will serve, so no request pays a kernel's first call.

One plan (``WarmupPlan``), run once by the model runner, in this order (all but the first in the engine's worker
thread):

1. ``compile`` (``--enable-torch-compile``): the decode step compiled for one row and for several, after prompts of
   one token and of more (``COMPILE_DECODE_ROWS``; a size of 1 is a shape of its own to the compiler), then the
   compiled prefill of short prompts and a decode step after each (``COMPILE_PREFILLS``). ``start()`` runs this
   phase itself, before the worker: a model the process cannot compile is refused there, not on a request.
2. ``graphs`` (``--enable-cuda-graph``): the CUDA graphs of the decode step captured (``memt_core.engine.graphs``).
3. ``lengths`` and ``batch_sizes``: the served shapes, below.

On a GPU the first call of a kernel at a new shape can cost seconds to a minute — Triton kernels (flash-linear-
attention's, the memory write's) compile and autotune for what they specialise on, CUDA graphs are captured —
and a request that arrives first pays it (issue 46: a replay at a new length took 40 s, later ones 0.26–2.5 s).
The engine runs, once, in its worker thread before it takes work: a prompt's prefill (without and with a memory
read) and a commit at each of ``lengths``, and a decode step of each of ``batch_sizes`` rows (and captures its CUDA
graphs). ``/health`` answers 503 "warming up" until it is done.

Lengths are buckets: 1, 3 and 7 tokens, then every power of two from 16 with the length one past it (kernels that
specialise on a length's divisibility see both kinds), up to the longest warmed length (8,192 by default, or the
context length). On the CPU nothing is compiled or autotuned on a first call, so ``auto`` warms nothing up there:
servers start at once (the tests start many); ``on`` warms up anywhere, ``off`` nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The longest prompt or commit the default plan warms up.
LONGEST = 8192
MODES = ("auto", "on", "off")


#: The compile phase's decode batches: per batch, the lengths of the prompts whose caches are joined into it
#: (unusual lengths beyond 1, so that no size is taken for another).
COMPILE_DECODE_ROWS = ((5,), (5, 7), (1,), (1, 1))
#: The compile phase's short prompts, each prefilled by the compiled step and then decoded one step (its cache is
#: laid out anew).
COMPILE_PREFILLS = (3, 9, 17)


@dataclass(frozen=True)
class WarmupPlan:
    """What runs before the engine reports ready: the compile phase, the CUDA graphs' capture, then prompt and
    commit lengths and decode batch sizes."""

    lengths: tuple[int, ...] = ()
    batch_sizes: tuple[int, ...] = ()
    compile: bool = False  # compile the decode step and short prefills first (``COMPILE_DECODE_ROWS``, ``COMPILE_PREFILLS``)
    graphs: bool = False  # capture the decode step's CUDA graphs

    @property
    def shapes(self) -> int:
        return len(self.lengths) + len(self.batch_sizes)

    @property
    def empty(self) -> bool:
        return not (self.shapes or self.compile or self.graphs)


def default_lengths(longest: int = LONGEST) -> tuple[int, ...]:
    """1, 3, 7, then 16, 17, 32, 33, … up to ``longest``."""
    sizes = {n for n in (1, 3, 7) if n <= longest}
    size = 16
    while size <= longest:
        sizes.add(size)
        if size + 1 <= longest:
            sizes.add(size + 1)
        size *= 2
    return tuple(sorted(sizes))


def default_batch_sizes(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, … up to ``max_rows``, and ``max_rows`` itself."""
    sizes, size = set(), 1
    while size < max_rows:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes | {max(1, max_rows)}))


def plan(mode: str, device_type: str, *, max_rows: int, context_length: int, lengths=None, batch_sizes=None,
         compiled: bool = False, graphs: bool = False) -> WarmupPlan | None:
    """The plan for ``mode`` on a device of ``device_type`` (with the compile phase and the graphs' capture when
    ``compiled``/``graphs``), or None when nothing is warmed up."""
    if mode not in MODES:
        raise ValueError(f"warm-up mode must be one of {', '.join(MODES)}, got {mode!r}")
    shapes = None
    if not (mode == "off" or (mode == "auto" and device_type != "cuda")):
        lengths = tuple(sorted(set(lengths))) if lengths else default_lengths(min(LONGEST, context_length))
        batch_sizes = tuple(sorted(set(batch_sizes))) if batch_sizes else default_batch_sizes(max_rows)
        shapes = WarmupPlan(lengths=lengths, batch_sizes=tuple(b for b in batch_sizes if b <= max_rows) or (1,))
    return including(shapes, compiled=compiled, graphs=graphs)


def including(shapes: WarmupPlan | None, *, compiled: bool, graphs: bool) -> WarmupPlan | None:
    """``shapes`` (a plan of lengths and batch sizes, or None) with the compile phase and the graphs' capture that an
    engine compiled with torch.compile or replaying CUDA graphs needs; None when there is nothing to run."""
    base = shapes or WarmupPlan()
    whole = WarmupPlan(lengths=base.lengths, batch_sizes=base.batch_sizes, compile=base.compile or compiled,
                       graphs=base.graphs or graphs)
    return None if whole.empty else whole


def described(plan: WarmupPlan | None) -> dict | None:
    """A plan as ``--dry-run`` prints it."""
    if plan is None:
        return None
    return {"lengths": list(plan.lengths), "batch_sizes": list(plan.batch_sizes), "compile": plan.compile, "graphs": plan.graphs}


def of_options(options) -> WarmupPlan:
    """The plan of an engine's options (``memt_core.engine.base.EngineOptions``)."""
    return plan(options.warmup, str(options.device).split(":")[0], max_rows=options.max_running_requests,
                context_length=options.context_length, lengths=options.warmup_lengths,
                batch_sizes=options.warmup_batch_sizes, compiled=options.torch_compile, graphs=options.cuda_graphs)
