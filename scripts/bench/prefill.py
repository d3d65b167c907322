#!/usr/bin/env python
"""A prompt's prefill, eager against the compiled step ``--enable-torch-compile`` runs it with, side by side.

One ``TorchEngine(torch_compile=True)`` is warmed up as a server's is; then each prompt length is prefilled on a
fresh cache by the eager model and by the engine's compiled step (called directly, so also past the lengths the
engine sends it), alternating, back to back and after a pause (a server's turn comes after the user's pause, when
the CPU's caches have gone cold). Prints the medians, compiled / eager per length, and the largest difference
between their last-token logits. The engine prefills lengths within ``COMPILED_PREFILL_TOKENS`` compiled, longer
ones eager.

    python scripts/bench/prefill.py [--model-path DIR] [--lengths 13,31,200,1000] [--repeats 12] [--pause 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memt_core.bundled import BUNDLED_MODEL  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=BUNDLED_MODEL, help="checkpoint (default: the bundled demo model)")
    parser.add_argument("--lengths", default="13,31,200,1000", help="prompt lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=12, help="prefills per mode, length and pause (median taken)")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds before each prefill in the paused case")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: what the servers use on 2 cores)")
    args = parser.parse_args(argv)

    import torch
    from transformers import DynamicCache

    from memt_core.engine import TorchEngine
    from memt_core.engine.torch_engine import COMPILED_PREFILL_TOKENS
    from memt_core.engine.warmup import WarmupPlan
    from memt_core.models.passes import memory_batch
    from memt_core.models.weights import load_model

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model = load_model(args.model_path, device="cpu", dtype=torch.float32).eval()
    engine = TorchEngine(model, torch_compile=True)
    started = time.monotonic()
    engine.runner.warm(WarmupPlan(compile=True), progress=lambda phase: None, stopping=lambda: False)  # in this thread
    print(f"compiled (decode step and short prefills) in {time.monotonic() - started:.0f} s; the engine prefills "
          f"{COMPILED_PREFILL_TOKENS[0]}-{COMPILED_PREFILL_TOKENS[1]} tokens compiled")
    vocab = model.config.get_text_config().vocab_size

    def eager(ids):
        return model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)

    def compiled(ids):  # the compiled step, also beyond the engine's range, to show why it stops there
        read = memory_batch(model, [None], zeros=True)
        return engine.runner.decoder(ids, memory=read, past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)

    print(" length | pause s | eager ms | compiled ms | compiled / eager | max |logit diff|")
    for length in (int(x) for x in args.lengths.split(",")):
        ids = (torch.arange(length) * 7 % (vocab - 10) + 5)[None]
        compiled(ids), eager(ids)  # a new length: the compiled step's first call at it
        for pause in (0.0, args.pause):
            seconds = {"eager": [], "compiled": []}
            for _ in range(args.repeats):
                for name, run in (("eager", eager), ("compiled", compiled)):
                    time.sleep(pause)
                    begun = time.perf_counter()
                    run(ids)
                    seconds[name].append(time.perf_counter() - begun)
            e, c = (statistics.median(seconds[name]) * 1000 for name in ("eager", "compiled"))
            diff = (eager(ids).logits - compiled(ids).logits).abs().max().item()
            print(f" {length:6d} | {pause:7.1f} | {e:8.2f} | {c:11.2f} | {c / e:16.2f} | {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
