#!/usr/bin/env python
"""The engine's fused decode step against the model's own (the reference), side by side: decode tokens/s and tokens.

Two ``TorchEngine``s on the same weights, one with ``fused_decode`` (``memt_core.models.decode``, the default) and one
without; each model's sessions hold a memory (one commit), every row reads it. For each batch size, repetitions
alternate between the engines (a busy machine slows both alike); the figure is the median decode rate (tokens/s
counted from the moment every request has its first token), then fused / reference, and whether both engines
produced the same greedy tokens.

Models: the bundled demo model, a tiny random Nano, and with ``--nano-widths`` a random Nano at the released model's
widths (4 layers, ``--experts`` experts; slow on a CPU).

    python scripts/bench/decode_paths.py [--rows 1,8] [--tokens 32] [--repeats 5] [--nano-widths]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from memt_core.bundled import BUNDLED_MODEL  # noqa: E402


async def open_sessions(engine, names: list[str], memory: list[int]) -> None:
    from memt_core.protocol import effects as fx

    for name in names:
        await engine.apply(fx.NewMemory(name))
        await engine.apply(fx.ForkCandidate(name, transaction="t"))
        await engine.commit(name, "t", "n", memory)
        await engine.apply(fx.PublishCandidate(name, transaction="t"))


async def decode(engine, names: list[str], prompt: list[int], tokens: int, serial: list[int]) -> tuple[float, list[list[int]]]:
    """Every session asks at once; (decode tokens/s once all have their first token, the answers)."""
    from memt_core.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=tokens, temperature=0, skip_eos=True)
    arrivals: list[list[float]] = [[] for _ in names]
    answers: list[list[int]] = [[] for _ in names]

    async def ask(i: int, name: str) -> None:
        serial[0] += 1
        async for event in engine.query(f"q{serial[0]}", prompt, params, session=name):
            if event.error is not None:
                raise event.error
            if event.token is not None:
                arrivals[i].append(time.perf_counter())
                answers[i].append(event.token)

    await asyncio.gather(*(ask(i, n) for i, n in enumerate(names)))
    start = max(times[0] for times in arrivals)
    end = max(times[-1] for times in arrivals)
    decoded = sum(1 for times in arrivals for t in times if t > start)
    return decoded / max(end - start, 1e-9), answers


def compare(label: str, model, rows_list: list[int], tokens: int, repeats: int) -> list[tuple]:
    from memt_core.engine import TorchEngine

    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    memory = torch.randint(3, vocab, (64,), generator=generator).tolist()
    prompt = torch.randint(3, vocab, (16,), generator=generator).tolist()
    engines = {
        "reference": TorchEngine(model, max_running_requests=max(rows_list), fused_decode=False).start(),
        "fused": TorchEngine(model, max_running_requests=max(rows_list)).start(),
    }
    assert engines["fused"].runner.fused is not None, f"{label}: no fused decode step for this model"
    loop = asyncio.new_event_loop()
    serial = [0]
    results = []
    try:
        names = [f"s{i}" for i in range(max(rows_list))]
        for engine in engines.values():
            loop.run_until_complete(open_sessions(engine, names, memory))
        for rows in rows_list:
            rates: dict[str, list[float]] = {name: [] for name in engines}
            answers: dict[str, list] = {}
            for repeat in range(repeats + 1):  # the first is a warm-up
                for name, engine in engines.items():
                    rate, answers[name] = loop.run_until_complete(decode(engine, names[:rows], prompt, tokens, serial))
                    if repeat:
                        rates[name].append(rate)
            reference, fused = statistics.median(rates["reference"]), statistics.median(rates["fused"])
            same = answers["reference"] == answers["fused"]
            results.append((label, rows, reference, fused, fused / reference, same))
            print(f"{label:>22}  {rows:>4}  {reference:>14,.0f}  {fused:>11,.0f}  {fused / reference:>15.2f}×  {'yes' if same else 'NO':>11}", flush=True)
    finally:
        for engine in engines.values():
            engine.stop()
        loop.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,8", help="decode batch sizes (default 1,8)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request (default 32)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per engine, after one warm-up (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: what the servers use on 2 cores)")
    parser.add_argument("--device", default="cpu", help="device (default cpu)")
    parser.add_argument("--nano-widths", action="store_true", help="also a random Nano at the released widths (4 layers)")
    parser.add_argument("--models", default="demo,tiny", help="which of demo, tiny to measure (default both; '' for none)")
    parser.add_argument("--experts", type=int, default=32, help="experts of the Nano-widths model (default 32)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows_list = [int(part) for part in args.rows.split(",") if part]
    from memt_core.models.weights import load_model
    from memt_core.tiny import random_model, write_config

    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    print(f"decode tokens/s, fused decode step vs the model's own (median of {args.repeats} alternating runs, "
          f"{args.tokens} tokens each, {args.threads} thread(s), {args.device}, torch {torch.__version__})")
    header = f"{'model':>22}  {'rows':>4}  {'reference tok/s':>14}  {'fused tok/s':>11}  {'fused/reference':>16}  {'same tokens':>11}"
    print(header)
    print("-" * len(header))
    models = {part for part in args.models.split(",") if part}
    results = []
    if "demo" in models:
        results += compare("demo (bundled)", load_model(BUNDLED_MODEL, device=args.device, dtype=dtype), rows_list, args.tokens, args.repeats)
    with tempfile.TemporaryDirectory(prefix="memt-decode-paths-") as scratch:
        if "tiny" in models:
            tiny = random_model(write_config(Path(scratch) / "tiny", "memt-nano"), device=args.device, dtype=dtype)
            results += compare("tiny Nano (random)", tiny, rows_list, args.tokens, args.repeats)
            del tiny
        if args.nano_widths:
            wide = random_model(write_config(Path(scratch) / "wide", "memt-nano", widths="nano", experts=args.experts),
                                device=args.device, dtype=dtype)
            results += compare(f"Nano widths ({args.experts} e.)", wide, rows_list, args.tokens, args.repeats)
    worst = min(r[4] for r in results)
    print(f"\nslowest fused/reference: {worst:.2f}× ({'not slower' if worst >= 0.97 else 'SLOWER'}); "
          f"same tokens in {sum(r[5] for r in results)} of {len(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
