#!/usr/bin/env python
"""A plain (non-streamed) answer's tokens handed over at the end against one event-loop wake-up per token.

    python scripts/bench/wakeups.py [--model-path DIR] [--tokens 24] [--repeats 20] [--core-args="FLAGS"]

The torch engine's worker thread hands each token to the server's event loop (``call_soon_threadsafe``);
every hand-over wakes the loop, which takes the GIL while the worker waits for it. A query the server
answers only at the end (no stream, no stop strings) asks the engine for ``incremental=False``: the
tokens after the first come with the last, in one wake-up. Measured side by side, alternating:

1. in-process: the engine itself, the same memory question with ``incremental`` True and False;
2. through a real core (``memt_core.launch`` on 127.0.0.1, its own process, ``--core-args`` passed on)
   and the native client: the same query plain, and with a stop string that never occurs (which makes
   the server watch each token's text, so it asks for every token; the extra work of looking for the
   string is a few string searches).

Prints each case's median latency, the ratio, and whether both gave the same tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from memt_core.bundled import BUNDLED_MODEL  # noqa: E402

FACT = "I have a kitten named Belkavo who loves small shrimp."
REPLY = "Got it! I will remember that your kitten is called Belkavo."
QUESTION = "What is my kitten's name?"
NEVER = "\u241fnever said\u241f"  # a stop string no answer contains


def alternate(repeats: int, cases: dict, run) -> dict[str, list]:
    """``run(case)`` → (seconds, tokens), ``repeats`` times per case, the cases taking turns (first round: warm-up)."""
    found: dict[str, list] = {name: [] for name in cases}
    answers: dict[str, list[int]] = {}
    names = list(cases)
    for round_ in range(repeats + 1):
        for name in names if round_ % 2 == 0 else names[::-1]:
            seconds, tokens = run(cases[name])
            answers.setdefault(name, tokens)
            assert answers[name] == tokens, f"{name}: the answer changed between repetitions"
            if round_:
                found[name].append(seconds)
    found["same tokens"] = len({tuple(tokens) for tokens in answers.values()}) == 1
    found["tokens"] = answers[names[0]]
    return found


def report(title: str, found: dict, base: str, other: str) -> None:
    a, b = statistics.median(found[base]), statistics.median(found[other])
    print(title)
    for name in (base, other):
        values = found[name]
        print(f"  {name:<44} median {statistics.median(values) * 1000:7.1f} ms (min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f})")
    print(f"  {other} / {base}: {b / a:.2f}; same tokens: {found['same tokens']}")


def in_process(args, prompt: list[int], told: list[int]) -> None:
    import torch

    from compile import new_session

    from memt_core.engine import TorchEngine
    from memt_core.models.weights import load_model
    from memt_core.sampling import SamplingParams

    torch.set_num_threads(1)
    engine = TorchEngine(load_model(args.model_path), threads=1).start()
    params = SamplingParams(temperature=0, max_new_tokens=args.tokens, skip_eos=True)
    loop = asyncio.new_event_loop()
    serial = [0]

    async def ask(incremental: bool) -> tuple[float, list[int]]:
        serial[0] += 1
        started, tokens = time.perf_counter(), []
        async for event in engine.query(f"q{serial[0]}", prompt, params, session="s", incremental=incremental):
            if event.error is not None:
                raise event.error
            if event.token is not None:
                tokens.append(event.token)
        return time.perf_counter() - started, tokens

    try:
        loop.run_until_complete(new_session(engine, "s", told))
        cases = {"one wake-up per token (incremental=True)": True, "tokens with the last (incremental=False)": False}
        found = alternate(args.repeats, cases, lambda incremental: loop.run_until_complete(ask(incremental)))
    finally:
        engine.stop()
        loop.close()
    report(f"1. the engine in this process, {args.tokens}-token memory answers (end-of-sequence skipped, 1 torch thread):", found, *cases)


def through_core(args, prompt: list[int], told: list[int]) -> None:
    from demo import free_port, start

    from memt_core.client.native import NativeClient

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="memt-bench-wakeups-") as work:
        command = ["-m", "memt_core.launch", "--model-path", str(args.model_path), "--port", str(port),
                   *shlex.split(args.core_args), "--log-level", "warning"]
        wait = 900.0 if "--enable-torch-compile" in args.core_args else 180.0
        core = start(command, url, Path(work) / "core.log", "the core", wait)
        try:
            with NativeClient(url) as client:
                session = client.control("create")["session"]
                lease = client.control("acquire", session)["lease"]
                client.control("begin", session, lease=lease, transaction="t")
                client.commit(session, lease, "t", told)
                client.control("publish", session, lease=lease, transaction="t")
                sampling = {"max_new_tokens": args.tokens, "temperature": 0}  # the protocol keeps end-of-sequence

                def ask(stop: list[str]) -> tuple[float, list[int]]:
                    started = time.perf_counter()
                    body = client.query(session, lease, prompt, sampling_params={**sampling, "stop": stop})
                    return time.perf_counter() - started, body["output_ids"]

                cases = {"plain: tokens with the last": [], "with a stop string: one wake-up per token": [NEVER]}
                found = alternate(args.repeats, cases, ask)
        finally:
            core.terminate()
            core.wait(30)
    flags = f" ({args.core_args})" if args.core_args else ""
    report(f"2. a core in its own process{flags}, native queries over HTTP ({len(found['tokens'])}-token greedy answers):", found, *cases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=BUNDLED_MODEL, help="checkpoint (default: the bundled demo model)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens of each answer (the in-process part skips end-of-sequence)")
    parser.add_argument("--repeats", type=int, default=20, help="answers per case (median taken)")
    parser.add_argument("--core-args", default="", help="launcher flags for the core of part 2, one string")
    args = parser.parse_args(argv)

    from transformers import PreTrainedTokenizerFast

    from memt_demo.format import DemoChatFormat

    fmt = DemoChatFormat(PreTrainedTokenizerFast.from_pretrained(str(args.model_path)))
    told = fmt.turn_prompt(FACT) + fmt.reply(REPLY)
    prompt = fmt.prompt([{"role": "user", "content": QUESTION}])
    in_process(args, prompt, told)
    through_core(args, prompt, told)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
