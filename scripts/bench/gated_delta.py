#!/usr/bin/env python
"""Time the gated-delta write: token-by-token reference against the chunked (WY) form.

The commit path (q=None) at several lengths, both in one run, after a warm-up, median of a few
repetitions; prints both times, their ratio and the largest relative difference of the final states,
then the target of the issue (chunked ≥ 10× reference at 2048 tokens on CPU) and whether it is met.
With ``--device cuda`` the tensors live on the GPU (timed with synchronisation) and, where
flash-linear-attention is installed, its Triton kernel is a third column.

    PYTHONPATH=. python scripts/bench/gated_delta.py                      # Nano-like: H=16, K=V=128
    PYTHONPATH=. python scripts/bench/gated_delta.py --geometry 8x64x64 --threads 2 --chunk-size 64
    PYTHONPATH=. python scripts/bench/gated_delta.py --device cuda        # + FLA's kernel when installed
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from memt_core.memory import fla
from memt_core.memory.gated_delta import CHUNK_SIZE, chunk_gated_delta_rule, recurrent_gated_delta_rule

TARGET_TOKENS = 2048
TARGET_RATIO = 10.0


def geometry(text: str) -> tuple[int, int, int]:
    try:
        heads, key_dim, value_dim = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--geometry wants HxKxV, e.g. 16x128x128; got {text!r}") from None
    if min(heads, key_dim, value_dim) <= 0:
        raise argparse.ArgumentTypeError("--geometry: H, K and V must be positive")
    return heads, key_dim, value_dim


def lengths(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("--lengths wants positive token counts, e.g. 512,2048,8192")
    return values


def write_inputs(batch: int, length: int, heads: int, key_dim: int, value_dim: int, seed: int, device: str = "cpu"):
    """k, v, g, β and an initial state as a memory module makes them (unit keys, g ≤ 0, β ∈ (0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    k = F.normalize(torch.randn(batch, length, heads, key_dim, generator=gen), dim=-1)
    v = torch.randn(batch, length, heads, value_dim, generator=gen)
    g = F.logsigmoid(torch.randn(batch, length, heads, generator=gen) + 4.0)
    beta = torch.sigmoid(torch.randn(batch, length, heads, generator=gen))
    state = torch.randn(batch, heads, key_dim, value_dim, generator=gen)
    return tuple(x.to(device) for x in (k, v, g, beta, state))


def median_seconds(runs: dict, repeats: int, warmup: int, device: str = "cpu") -> dict[str, tuple[float, torch.Tensor]]:
    """Median wall time of each run; repetitions interleave the runs, so a busy machine slows all alike."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    results = {}
    for name, run in runs.items():
        for _ in range(warmup):
            results[name] = run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            results[name] = run()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), results[name]) for name in runs}


def relative_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected).abs().max() / expected.abs().max()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--geometry", type=geometry, default=(16, 128, 128), metavar="HxKxV",
                        help="heads x key dim x value dim (default: 16x128x128, Nano-like)")
    parser.add_argument("--lengths", type=lengths, default=[512, 2048, 8192], metavar="N,N,...",
                        help="token counts to time (default: 512,2048,8192)")
    parser.add_argument("--batch", type=int, default=1, help="batch size B (default: 1)")
    parser.add_argument("--chunk-size", type=int, default=CHUNK_SIZE, help=f"chunk size of the chunked form (default: {CHUNK_SIZE})")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="'cpu' (default; the target is on CPU) or 'cuda'")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions per measurement, median taken (default: 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before timing (default: 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    heads, key_dim, value_dim = args.geometry
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    with_fla = device.type == "cuda" and fla.available()

    print(
        f"gated delta write (q=None, the commit path) on {device}: B={args.batch} H={heads} "
        f"K={key_dim} V={value_dim}, chunk size {args.chunk_size}, {torch.get_num_threads()} thread(s), "
        f"median of {args.repeats} interleaved runs after {args.warmup} warm-up; torch {torch.__version__}"
    )
    if device.type == "cuda":
        print(f"flash-linear-attention: {'its Triton kernel is the last columns' if with_fla else 'not installed (pip install fla-core)'}")
    header = f"{'tokens':>7}  {'reference ms':>13}  {'chunked ms':>11}  {'ref/chunked':>11}  {'max rel diff':>12}"
    if with_fla:
        header += f"  {'FLA ms':>8}  {'ref/FLA':>8}  {'FLA rel diff':>12}"
    print(header)
    print("-" * len(header))
    ratios = {}
    with torch.inference_mode():
        for length in args.lengths:
            k, v, g, beta, state = write_inputs(args.batch, length, heads, key_dim, value_dim, args.seed, args.device)
            runs = {
                "reference": lambda: recurrent_gated_delta_rule(None, k, v, g, beta, state)[1],
                "chunked": lambda: chunk_gated_delta_rule(None, k, v, g, beta, state, chunk_size=args.chunk_size)[1],
            }
            if with_fla:
                runs["fla"] = lambda: fla.write(k, v, g, beta, state)
            timed = median_seconds(runs, args.repeats, args.warmup, args.device)
            reference, expected = timed["reference"]
            chunked, actual = timed["chunked"]
            ratios[length] = reference / chunked
            line = (
                f"{length:>7}  {reference * 1e3:>13.1f}  {chunked * 1e3:>11.1f}  {ratios[length]:>10.1f}×  "
                f"{relative_difference(actual, expected):>12.1e}"
            )
            if with_fla:
                seconds, result = timed["fla"]
                line += f"  {seconds * 1e3:>8.2f}  {reference / seconds:>7.0f}×  {relative_difference(result, expected):>12.1e}"
            print(line, flush=True)

    print()
    line = f"target: chunked ≥ {TARGET_RATIO:g}× reference at {TARGET_TOKENS} tokens on CPU"
    if device.type != "cpu":
        print(f"{line}: not measured (this run was on {device})")
    elif TARGET_TOKENS in ratios:
        met = ratios[TARGET_TOKENS] >= TARGET_RATIO
        print(f"{line}: {'met' if met else 'NOT met'} (measured {ratios[TARGET_TOKENS]:.1f}× at {heads}x{key_dim}x{value_dim})")
    else:
        print(f"{line}: not measured (add {TARGET_TOKENS} to --lengths)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
