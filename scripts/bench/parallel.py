#!/usr/bin/env python
"""Tensor parallelism on CPU ranks: decode and commit tokens/s at TP 1 and TP 2, and the bytes each decode step sends.

Two torch engines on the same checkpoint, side by side in one run: one on one rank, one on ``--tp`` ranks (rank 0
here, the others processes of their own over gloo; ``memt_core.parallel``). Repetitions alternate between them and
medians are taken, so a busy machine slows both alike. Printed:

- decode tokens/s with ``--sessions`` sessions decoding at once (each reading its own memory), counted from the moment
  every request has its first token (prefill excluded), and the TP/TP 1 ratio;
- commit tokens/s of ``--commit-tokens`` tokens into a session's memory, and the ratio;
- per decode step, the collectives and bytes rank 0 sent (an all-reduce of ``n`` bytes over ``r`` ranks counted as a
  ring's ``2 n (r-1)/r``; the logits' all-gather as ``n (r-1)``), and the same per token.

On a 2-core machine TP 2 is slower than TP 1: each rank has one core, and every block waits for a gloo all-reduce (on
the order of a millisecond under load). The CPU figures prove equality and count the collectives; what TP buys on
GPUs is estimated in docs/deployment.md.

With ``--dp-attention`` the parallel engine is Flash's seed mode at ``--tp`` ranks (TP = EP = DP, attention whole on
each rank, its sessions spread over the ranks, the MLP blocks meeting in rounds: ``memt_core.parallel.dp``), on a
tiny random Flash by default; a decode "step" is then one rank's batch (the engine counts each rank's as one).

    PYTHONPATH=. python scripts/bench/parallel.py
    PYTHONPATH=. python scripts/bench/parallel.py --model-path memt_core/bundled/memt-tiny-demo --sessions 4
    PYTHONPATH=. python scripts/bench/parallel.py --dp-attention
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from memt_core.checkpoint import read_checkpoint
from memt_core.engine import EngineOptions, TorchEngine
from memt_core.parallel.plan import Parallel
from memt_core.protocol import effects as fx
from memt_core.sampling import SamplingParams


def ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(10, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def setup(engine, sessions: int, vocab: int) -> None:
    for i in range(sessions):
        await engine.apply(fx.NewMemory(f"s{i}"))
        await engine.apply(fx.ForkCandidate(f"s{i}", transaction="t"))
        await engine.commit(f"s{i}", "t", "setup", ids(64, i, vocab))
        await engine.apply(fx.PublishCandidate(f"s{i}", transaction="t"))
    await engine.apply(fx.ForkCandidate("s0", transaction="bench"))


def traffic(engine) -> tuple[int, int]:
    group = getattr(engine.runner, "group", None)
    return (group.traffic.collectives, group.traffic.bytes) if group is not None else (0, 0)


async def decode(engine, sessions: int, prompt: list[int], new_tokens: int) -> dict:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, skip_eos=True)
    started, marks = [0], {}
    arrivals: list[list[float]] = [[] for _ in range(sessions)]

    async def run(i: int) -> None:
        async for event in engine.query(f"d{time.monotonic_ns()}-{i}", prompt, params, session=f"s{i}"):
            if event.error is not None:
                raise event.error
            if event.token is not None:
                arrivals[i].append(time.perf_counter())
                if len(arrivals[i]) == 1:
                    started[0] += 1
                    if started[0] == sessions:  # every request is past its prefill: decode only from here
                        marks["start"] = (time.perf_counter(), engine.stats.decode_steps, *traffic(engine))

    await asyncio.gather(*(run(i) for i in range(sessions)))
    end = max(times[-1] for times in arrivals)
    t0, steps0, calls0, bytes0 = marks["start"]
    decoded = sum(1 for times in arrivals for t in times if t > t0)
    steps = engine.stats.decode_steps - steps0
    calls, sent = (a - b for a, b in zip(traffic(engine), (calls0, bytes0)))
    return {"tok_s": decoded / max(end - t0, 1e-9), "steps": steps, "calls": calls, "bytes": sent, "tokens": decoded}


async def commit(engine, tokens: list[int]) -> float:
    start = time.perf_counter()
    await engine.commit("s0", "bench", f"c{time.monotonic_ns()}", tokens)
    return len(tokens) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint directory (default: a tiny random Nano in a temp dir)")
    parser.add_argument("--tp", type=int, default=2, help="ranks of the parallel engine (default 2)")
    parser.add_argument("--sessions", type=int, default=4, help="sessions decoding at once (default 4)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens each request generates (default 32)")
    parser.add_argument("--commit-tokens", type=int, default=512, help="tokens of the commit measured (default 512)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repetitions, medians taken (default 3)")
    parser.add_argument("--dp-attention", action="store_true", help="Flash's seed mode: TP = EP = DP = --tp with DP attention")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="memt-bench-tp-") as scratch:
        if args.model_path is None:
            from memt_core.tiny import make_tiny_checkpoint

            family = "memt-flash" if args.dp_attention else "memt-nano"
            path, source = make_tiny_checkpoint(Path(scratch) / "tiny", family), f"tiny random {family}"
        else:
            path, source = Path(args.model_path), args.model_path
        checkpoint = read_checkpoint(path)
        vocab = int(checkpoint.backbone["vocab_size"])
        base = EngineOptions(device="cpu", max_running_requests=max(args.sessions, 1), max_commit_batch=1, threads=1)
        split = Parallel(tp=args.tp, ep=args.tp, dp=args.tp, dp_attention=True) if args.dp_attention else Parallel(tp=args.tp)
        engines = {1: TorchEngine.load(checkpoint, base).start(),
                   args.tp: TorchEngine.load(checkpoint, dataclasses.replace(base, parallel=split)).start()}
        loop = asyncio.new_event_loop()
        try:
            for engine in engines.values():
                loop.run_until_complete(setup(engine, args.sessions, vocab))
            prompt, tokens = ids(16, 7, vocab), ids(args.commit_tokens, 8, vocab)
            found = {tp: {"decode": [], "commit": []} for tp in engines}
            for repeat in range(args.repeats + 1):  # the first round warms up, untimed
                for tp, engine in engines.items():
                    run = loop.run_until_complete(decode(engine, args.sessions, prompt, args.new_tokens))
                    rate = loop.run_until_complete(commit(engine, tokens))
                    if repeat:
                        found[tp]["decode"].append(run)
                        found[tp]["commit"].append(rate)
        finally:
            for engine in engines.values():
                engine.stop()
            loop.close()
    mode = "DP attention (TP = EP = DP)" if args.dp_attention else "TP"
    print(f"torch engine on the CPU, one torch thread per rank, {mode}; model: {source}; {args.sessions} sessions × {args.new_tokens} "
          f"tokens, commit of {args.commit_tokens}; median of {args.repeats} alternating runs; torch {torch.__version__}")
    header = f"{'ranks':>5}  {'decode tok/s':>12}  {'vs TP 1':>7}  {'commit tok/s':>12}  {'vs TP 1':>7}  {'collectives/step':>16}  {'bytes/step/rank':>15}  {'bytes/token':>11}"
    print(header)
    print("-" * len(header))
    base_decode = statistics.median(r["tok_s"] for r in found[1]["decode"])
    base_commit = statistics.median(found[1]["commit"])
    for tp, runs in found.items():
        rate = statistics.median(r["tok_s"] for r in runs["decode"])
        committed = statistics.median(runs["commit"])
        steps = sum(r["steps"] for r in runs["decode"])
        calls = sum(r["calls"] for r in runs["decode"]) / max(steps, 1)
        sent = sum(r["bytes"] for r in runs["decode"]) / max(steps, 1)
        per_token = sum(r["bytes"] for r in runs["decode"]) / max(sum(r["tokens"] for r in runs["decode"]), 1)
        print(f"{tp:>5}  {rate:>12,.0f}  {rate / base_decode:>6.2f}×  {committed:>12,.0f}  {committed / base_commit:>6.2f}×  "
              f"{calls:>16.1f}  {sent:>15,.0f}  {per_token:>11,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
