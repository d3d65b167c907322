#!/usr/bin/env python
"""A burst of long prompts against the KV budget: admitted, queued, refused, and the KV held against the budget.

Three torch engines on the same checkpoint, one after the other: two with ``--max-total-tokens`` and
``--max-queued-requests`` (``memt_core.engine.admission``; the growing cache, then the paged pool), one without either (today's default). Each takes a burst
of ``--burst`` queries at once, every one a prompt of ``--prompt-tokens`` tokens asking for ``--new-tokens``. Printed
per engine: queries answered, refused with 503 (the queue was full), the most that waited at once, the KV tokens the
running queries reserved at most against the budget, the KV tokens the runner's caches really held at most (measured
after every step: the growing cache's padding included, the paged pool's blocks in use), and the burst's wall time.

Then decode tokens/s with the paged KV pool (``--kv-pool paged``), and with it the state slots (what a server with
``--max-total-tokens`` runs: ``memt_core.engine.state_slots``), against transformers' growing cache, at 1 and 16
sessions, alternating, medians of ``--repeats``.

    PYTHONPATH=. python scripts/bench/budget.py
    PYTHONPATH=. python scripts/bench/budget.py --budget 4096 --queue 8 --burst 32
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import torch

from memt_core.engine import TorchEngine
from memt_core.engine.state_slots import slots_for
from memt_core.errors import EngineBusy
from memt_core.models.weights import load_model
from memt_core.sampling import SamplingParams


async def burst(engine, prompts: list[list[int]], new_tokens: int) -> dict:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0)
    answered = refused = 0
    most_waiting = 0

    async def one(i: int, prompt: list[int]):
        nonlocal answered, refused
        try:
            events = engine.query(f"b{i}", prompt, params)
        except EngineBusy:
            refused += 1
            return
        async for event in events:
            if event.error is not None:
                raise event.error
        answered += 1

    async def watch():
        nonlocal most_waiting
        while True:
            most_waiting = max(most_waiting, engine.stats.queued)
            await asyncio.sleep(0.005)

    watcher = asyncio.ensure_future(watch())
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    watcher.cancel()
    return {"answered": answered, "refused": refused, "most_waiting": most_waiting}


def run(model, prompts, new_tokens: int, **limits) -> dict:
    engine = TorchEngine(model, max_running_requests=64, **limits).start()
    started = time.perf_counter()
    try:
        found = asyncio.run(burst(engine, prompts, new_tokens))
    finally:
        engine.stop()
    stats = engine.stats
    return {**found, "seconds": time.perf_counter() - started, "held_peak": stats.kv_held_peak, "reserved_peak": stats.kv_reserved_peak}


def decode_rate(engine, prompts, new_tokens: int) -> float:
    """Decode tokens/s of ``prompts`` together, from the moment each has its first token."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, skip_eos=True)
    firsts, ends, counts = [], [], []

    async def one(i, prompt):
        times = []
        async for event in engine.query(f"d{time.monotonic_ns()}-{i}", prompt, params):
            if event.token is not None:
                times.append(time.perf_counter())
        firsts.append(times[0])
        ends.append(times[-1])
        counts.append(len(times) - 1)

    async def all_of():
        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    asyncio.run(all_of())
    return sum(counts) / max(max(ends) - max(firsts), 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default="memt_core/bundled/memt-tiny-demo")
    parser.add_argument("--burst", type=int, default=24, help="queries sent at once (default 24)")
    parser.add_argument("--prompt-tokens", type=int, default=200, help="tokens of each prompt (default 200)")
    parser.add_argument("--new-tokens", type=int, default=24, help="max_new_tokens of each (default 24)")
    parser.add_argument("--budget", type=int, default=1024, help="--max-total-tokens of the bounded engine (default 1024)")
    parser.add_argument("--queue", type=int, default=12, help="--max-queued-requests of the bounded engine (default 12)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating decode runs, medians taken (default 3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(Path(args.model_path))
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, model.config.vocab_size, (args.prompt_tokens,), generator=generator).tolist() for _ in range(args.burst)]
    print(f"a burst of {args.burst} queries of {args.prompt_tokens} prompt tokens + {args.new_tokens} new, at once; model: "
          f"{args.model_path}; CPU, one torch thread; torch {torch.__version__}")
    header = f"{'engine':<44} {'answered':>8} {'refused':>7} {'most waiting':>12} {'reserved peak':>13} {'KV held peak':>12} {'seconds':>8}"
    print(header)
    print("-" * len(header))
    bounded = {"max_total_tokens": args.budget, "max_queued_requests": args.queue}
    for name, limits in ((f"--max-total-tokens {args.budget} --max-queued-requests {args.queue}", bounded),
                         ("the same, --kv-pool paged", {**bounded, "kv_pool_tokens": args.budget}),
                         ("no budget, no queue bound", {})):
        r = run(model, prompts, args.new_tokens, **limits)
        print(f"{name:<44} {r['answered']:>8} {r['refused']:>7} {r['most_waiting']:>12} {r['reserved_peak']:>13,} "
              f"{r['held_peak']:>12,} {r['seconds']:>8.2f}")
    import statistics

    budget = 16 * (args.prompt_tokens + 2 * args.new_tokens)
    engines = {"growing cache (dynamic)": TorchEngine(model, max_running_requests=16, max_total_tokens=budget).start(),
               "paged pool (--kv-pool paged)": TorchEngine(model, max_running_requests=16, max_total_tokens=budget,
                                                           kv_pool_tokens=budget).start(),
               "paged pool + state slots": TorchEngine(model, max_running_requests=16, max_total_tokens=budget,
                                                       kv_pool_tokens=budget, memory_state_slots=slots_for(16, 1)).start()}
    rates = {name: {1: [], 16: []} for name in engines}
    try:
        for repeat in range(args.repeats + 1):  # the first round warms up, untimed
            for sessions in (1, 16):
                for name, engine in engines.items():
                    rate = decode_rate(engine, prompts[:sessions] * (sessions // len(prompts[:sessions])), args.new_tokens * 2)
                    if repeat:
                        rates[name][sessions].append(rate)
    finally:
        for engine in engines.values():
            engine.stop()
    print()
    header = f"{'decode, the same prompts':<30} {'1 session tok/s':>15} {'16 sessions tok/s':>17}"
    print(header)
    print("-" * len(header))
    base = {n: statistics.median(rates["growing cache (dynamic)"][n]) for n in (1, 16)}
    for name, found in rates.items():
        one, many = statistics.median(found[1]), statistics.median(found[16])
        print(f"{name:<30} {one:>9,.0f} ({one / base[1]:.2f}×) {many:>10,.0f} ({many / base[16]:.2f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
