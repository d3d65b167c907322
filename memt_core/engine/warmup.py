"""What the torch engine runs before it reports ready: the shapes it will serve, so no request pays a kernel's first call.

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


@dataclass(frozen=True)
class WarmupPlan:
    """The prompt and commit lengths, and the decode batch sizes, run before the engine reports ready."""

    lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]

    @property
    def shapes(self) -> int:
        return len(self.lengths) + len(self.batch_sizes)


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


def plan(mode: str, device_type: str, *, max_rows: int, context_length: int, lengths=None, batch_sizes=None) -> WarmupPlan | None:
    """The plan for ``mode`` on a device of ``device_type``, or None when nothing is warmed up."""
    if mode not in MODES:
        raise ValueError(f"warm-up mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off" or (mode == "auto" and device_type != "cuda"):
        return None
    lengths = tuple(sorted(set(lengths))) if lengths else default_lengths(min(LONGEST, context_length))
    batch_sizes = tuple(sorted(set(batch_sizes))) if batch_sizes else default_batch_sizes(max_rows)
    return WarmupPlan(lengths=lengths, batch_sizes=tuple(b for b in batch_sizes if b <= max_rows) or (1,))
