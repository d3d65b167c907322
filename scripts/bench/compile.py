#!/usr/bin/env python
"""The torch engine with and without ``--enable-torch-compile``: a memory turn's latency, side by side.

Three engines on the same weights: eager; compiled (its decode step; ``TorchEngine(torch_compile=True)``);
and compiled with inductor's Python wrapper (the kernels called from generated Python, where the engine has
them called from generated C++ on the CPU: ``cpp_wrapper``, see ``memt_core.engine.torch_engine.inductor_options``).
Each has sessions whose memory holds a told fact. A turn is a question answered with exactly ``--tokens`` greedy
tokens (end-of-sequence skipped) while 1 and then ``--sessions`` sessions ask at once; repetitions alternate
between the engines, so a busy machine slows all alike. Prints the compile time, each engine's median turn
latency, compiled / eager, compiled / compiled with the Python wrapper, and whether all gave the same tokens.
(A variant that differs in what its graphs take from the model's modules, such as transformers' ``grouped_mm``
experts, cannot share a process with these: see ``memt_core.engine.device.compile_model``. The guards the engine leaves out are
measured by ``scripts/bench/guards.py``, each engine in a process of its own.)

    python scripts/bench/compile.py [--model-path DIR] [--tokens 24] [--sessions 4] [--repeats 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memt_core.bundled import BUNDLED_MODEL  # noqa: E402


async def new_session(engine, name: str, ids: list[int]) -> None:
    """A session whose published memory holds ``ids`` (one commit)."""
    from memt_core.protocol import effects as fx

    await engine.apply(fx.NewMemory(name))
    await engine.apply(fx.ForkCandidate(name, transaction="t"))
    await engine.commit(name, "t", "n", ids)
    await engine.apply(fx.PublishCandidate(name, transaction="t"))


def memory_turn(model_path: Path, tokens: int) -> tuple[list[int], list[int], object]:
    """The benches' memory turn on ``model_path``'s demo format: the told fact's tokens (a commit), the question's
    prompt, and greedy sampling of exactly ``tokens`` tokens."""
    from transformers import PreTrainedTokenizerFast

    from memt_demo.format import DemoChatFormat
    from memt_core.sampling import SamplingParams

    fmt = DemoChatFormat(PreTrainedTokenizerFast.from_pretrained(str(model_path)))
    told = fmt.turn_prompt("I have a kitten named Belkavo who loves small shrimp.") + fmt.reply("Got it! I will remember that your kitten is called Belkavo.")
    prompt = fmt.prompt([{"role": "user", "content": "What is my kitten's name?"}])
    return told, prompt, SamplingParams(temperature=0, max_new_tokens=tokens, skip_eos=True)


async def turns(engine, sessions: list[str], prompt: list[int], params, serial: list[int]) -> tuple[float, list[list[int]]]:
    """Every session asks at once; (seconds until the last answer is complete, the answers)."""

    async def ask(session: str) -> list[int]:
        serial[0] += 1
        tokens = []
        async for event in engine.query(f"bench-{serial[0]}", prompt, params, session=session):
            if event.error is not None:
                raise event.error
            if event.token is not None:
                tokens.append(event.token)
        return tokens

    started = time.perf_counter()
    answers = await asyncio.gather(*(ask(s) for s in sessions))
    return time.perf_counter() - started, list(answers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=BUNDLED_MODEL, help="checkpoint (default: the bundled demo model)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: what the servers use on 2 cores, one fewer than the cores)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens of each answer")
    parser.add_argument("--sessions", type=int, default=4, help="sessions asking at once in the batched case")
    parser.add_argument("--repeats", type=int, default=15, help="turns per engine and case (median taken)")
    args = parser.parse_args(argv)

    import torch

    from memt_core.engine import TorchEngine
    from memt_core.models.weights import load_model

    torch.set_num_threads(args.threads)
    # the compiled engines' graphs are all entries of the one forward's cache (several shape classes each)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    model = load_model(args.model_path)
    told, prompt, params = memory_turn(args.model_path, args.tokens)

    eager = TorchEngine(model).start()
    started = time.perf_counter()
    compiled = TorchEngine(model, torch_compile=True).start()
    compile_seconds = time.perf_counter() - started
    engines = {"eager": eager, "compiled": compiled,
               "python wrapper": TorchEngine(load_model(args.model_path), torch_compile=True, compile_options={}).start()}
    loop, serial = asyncio.new_event_loop(), [0]
    try:
        names = [f"s{i}" for i in range(max(1, args.sessions))]
        for engine in engines.values():
            for name in names:
                loop.run_until_complete(new_session(engine, name, told))
        print(f"{args.model_path.name}: {args.tokens}-token answers reading memory, {args.threads} thread(s), "
              f"median of {args.repeats} alternating turns; compiling took {compile_seconds:.0f} s; torch {torch.__version__}")
        header = (f"{'sessions asking':>16}  {'eager s':>8}  {'compiled s':>10}  {'Python wrapper s':>16}"
                  f"  {'compiled/eager':>14}  {'compiled/Python wrapper':>23}  same answers")
        print(header)
        print("-" * len(header))
        for sessions in (names[:1], names):
            times: dict[str, list[float]] = {name: [] for name in engines}
            answers: dict[str, list] = {}
            for repeat in range(args.repeats + 1):  # the first round is a warm-up
                for name, engine in engines.items():
                    seconds, answers[name] = loop.run_until_complete(turns(engine, sessions, prompt, params, serial))
                    if repeat:
                        times[name].append(seconds)
            e, c, p = (statistics.median(times[name]) for name in engines)
            same = all(answers[name] == answers["eager"] for name in engines)
            print(f"{len(sessions):>16}  {e:>8.3f}  {c:>10.3f}  {p:>16.3f}  {c / e:>13.2f}×  {c / p:>22.2f}×  {same}", flush=True)
    finally:
        for engine in engines.values():
            engine.stop()
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
