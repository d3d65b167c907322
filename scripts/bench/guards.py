#!/usr/bin/env python
"""The compiled decode step with and without the guards on the model's modules, each in a process of its own.

``--enable-torch-compile`` leaves out the guards (the checks dynamo runs before every call that a compiled graph
still fits) on the model's modules: thousands of attribute checks that no call can fail, since nothing changes a
loaded model (``memt_core.engine.device.compile_model``). Compiled engines of one process share
their graphs, so the two engines compared here run in two child processes, and the parent has them take turns:
a memory turn answered with exactly ``--tokens`` greedy tokens, ``--repeats`` times each, so a busy machine slows
both alike. Each child also measures, alternating in its own process, the same turn with every guard but those
that tell its graphs apart skipped (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``): the share of the
turn that the guards it keeps still cost. Prints the median turn of each, their ratio, and the guards' shares.

    python scripts/bench/guards.py [--model-path DIR] [--tokens 24] [--repeats 21]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memt_core.bundled import BUNDLED_MODEL  # noqa: E402


def child(model_path: Path, tokens: int, module_guards: bool) -> None:
    """Serve turns on stdin's commands ("turn" or "unguarded"), answering each with its seconds and tokens."""
    import torch

    from compile import memory_turn, new_session, turns
    from memt_core.engine import TorchEngine
    from memt_core.models.weights import load_model

    torch.set_num_threads(1)
    told, prompt, params = memory_turn(model_path, tokens)
    engine = TorchEngine(load_model(model_path), torch_compile=True, module_guards=module_guards).start()
    loop, serial = asyncio.new_event_loop(), [0]
    loop.run_until_complete(new_session(engine, "s", told))
    print(json.dumps({"ready": True}), flush=True)
    try:
        for command in sys.stdin:
            torch.compiler.set_stance("default", skip_guard_eval_unsafe=command.strip() == "unguarded")
            seconds, answers = loop.run_until_complete(turns(engine, ["s"], prompt, params, serial))
            print(json.dumps({"seconds": seconds, "tokens": answers[0]}), flush=True)
    finally:
        engine.stop()
        loop.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=BUNDLED_MODEL, help="checkpoint (default: the bundled demo model)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens of each answer")
    parser.add_argument("--repeats", type=int, default=21, help="turns per engine and case (median taken)")
    parser.add_argument("--child", choices=["left-out", "kept"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.model_path, args.tokens, module_guards=args.child == "kept")
        return 0

    started = time.perf_counter()
    children = {
        label: subprocess.Popen([sys.executable, __file__, "--child", label, "--model-path", str(args.model_path), "--tokens", str(args.tokens)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for label in ("left-out", "kept")
    }

    def ask(label: str, command: str) -> dict:
        process = children[label]
        process.stdin.write(command + "\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline())

    try:
        for process in children.values():
            if not json.loads(process.stdout.readline() or "{}").get("ready"):
                raise SystemExit("a child process did not start its engine")
        print(f"{args.model_path.name}: {args.tokens}-token answers reading memory, 1 thread, both engines compiled "
              f"in {time.perf_counter() - started:.0f} s; median of {args.repeats} alternating turns", flush=True)
        times: dict[tuple[str, str], list[float]] = {(label, command): [] for label in children for command in ("turn", "unguarded")}
        tokens: dict[tuple[str, str], list[int]] = {}
        for repeat in range(args.repeats + 1):  # the first round is a warm-up
            for label in children:
                for command in ("turn", "unguarded"):
                    answer = ask(label, command)
                    tokens[(label, command)] = answer["tokens"]
                    if repeat:
                        times[(label, command)].append(answer["seconds"])
    finally:
        for process in children.values():
            process.stdin.close()
        for process in children.values():
            process.wait(timeout=60)
    median = {key: statistics.median(values) for key, values in times.items()}
    for label, what in (("left-out", "module guards left out (the engine)"), ("kept", "module guards kept")):
        print(f"   {what}: turn {1000 * median[(label, 'turn')]:.1f} ms; with only the guards that tell graphs apart "
              f"{1000 * median[(label, 'unguarded')]:.1f} ms (the guards kept cost {1 - median[(label, 'unguarded')] / median[(label, 'turn')]:.0%} of the turn)")
    print(f"   left out / kept: {median[('left-out', 'turn')] / median[('kept', 'turn')]:.2f}×; the same tokens: {len(set(map(tuple, tokens.values()))) == 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
