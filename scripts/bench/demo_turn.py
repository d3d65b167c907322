#!/usr/bin/env python
"""Latency of one demo turn: a 30-token answer of the bundled model reading its memory, on CPU.

    python scripts/bench/demo_turn.py [--model-path DIR] [--threads 1,2] [--busy 0] [--runs 20] [--tokens 30]

A fact turn is committed to a session's memory, then a question is answered with exactly ``--tokens``
new tokens (end-of-sequence skipped, greedy) through the in-process API (``MemTRuntime``), ``--runs``
times for each torch thread count in ``--threads``, the counts taking turns run by run. Prints each
count's median and spread in seconds, and each median over the first count's. ``--busy N`` keeps N other
processes spinning on the CPU meanwhile (as a server's own threads, a proxy or the app would): a thread
pool whose workers wait for a busy core stalls at every op. The issue's limit for the demo is a median
of 0.3 s for a 30-token answer on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memt_core.bundled import BUNDLED_MODEL  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=BUNDLED_MODEL)
    parser.add_argument("--threads", default="1,2", help="torch thread counts to compare, comma-separated")
    parser.add_argument("--busy", type=int, default=0, help="other processes kept spinning on the CPU meanwhile")
    parser.add_argument("--runs", type=int, default=20, help="runs per thread count")
    parser.add_argument("--tokens", type=int, default=30)
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads takes comma-separated counts, got {args.threads!r}")
    if min(counts) < 1 or args.busy < 0 or args.runs < 1:
        parser.error("thread counts and --runs must be at least 1, --busy at least 0")

    import torch
    from transformers import PreTrainedTokenizerFast

    from memt_demo.format import DemoChatFormat
    from memt_core.inference import MemTRuntime
    from memt_core.sampling import SamplingParams

    runtime = MemTRuntime.load(args.model_path)
    fmt = DemoChatFormat(PreTrainedTokenizerFast.from_pretrained(str(args.model_path)))
    session = runtime.open_session()
    told = "I have a three-month-old kitten named Belkavo who loves eating small shrimp."
    session.commit(fmt.turn_prompt(told) + fmt.reply("Got it! I will remember that your kitten is called Belkavo."))
    prompt = fmt.prompt([{"role": "user", "content": "What is my kitten's name?"}])
    params = SamplingParams(temperature=0, max_new_tokens=args.tokens, skip_eos=True)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    times: dict[int, list[float]] = {n: [] for n in counts}
    try:
        for n in counts:  # warm-up
            torch.set_num_threads(n)
            session.generate(prompt, params)
        for run in range(args.runs):
            for n in counts if run % 2 == 0 else counts[::-1]:
                torch.set_num_threads(n)  # this thread's count: the runtime computes on it
                started = time.perf_counter()
                out = session.generate(prompt, params)
                times[n].append(time.perf_counter() - started)
                assert len(out.output_ids) == args.tokens
    finally:
        for process in busy:
            process.kill()
    first = statistics.median(times[counts[0]])
    print(f"{args.tokens}-token answer with memory, {args.runs} runs per thread count, {args.busy} other busy process(es):")
    for n, values in times.items():
        median = statistics.median(values)
        print(f"  {n} thread(s): median {median:.3f} s (min {min(values):.3f}, max {max(values):.3f}), {median / first:.2f}x {counts[0]} thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
