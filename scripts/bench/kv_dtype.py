#!/usr/bin/env python
"""The FP8 KV cache against the compute dtype's: greedy agreement and logit error, side by side in one run.

For each prompt, a greedy generation with the KV cache in the compute dtype (``--kv-cache-dtype auto``) and one with
it in FP8 (``fp8_e4m3``, ``memt_core.engine.fp8_kv``), from the same weights. Printed per model: the share of
generations identical to the end, the mean share of tokens before the first difference, and the logit error of
the FP8 cache along the compute dtype's own tokens (teacher-forced: max |Δlogit| over max |logit|, median and
worst over every step), with the cache's bytes per token for both.

    PYTHONPATH=. python scripts/bench/kv_dtype.py                       # the bundled demo model and a tiny Nano
    PYTHONPATH=. python scripts/bench/kv_dtype.py --model-path CHECKPOINT --dtype bfloat16 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from memt_core.engine.device import kv_token_bytes
from memt_core.engine.fp8_kv import new_cache
from memt_core.models.weights import load_model


def prompts(vocab: int, count: int, length: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(10, vocab, (length,), generator=generator).tolist() for _ in range(count)]


@torch.no_grad()
def greedy(model, prompt: list[int], n: int, kv: str) -> list[int]:
    device = next(model.parameters()).device
    out = model(torch.tensor([prompt], device=device), past_key_values=new_cache(model.config, kv), use_cache=True, logits_to_keep=1)
    tokens = [int(out.logits[0, -1].argmax())]
    for _ in range(n - 1):
        out = model(torch.tensor([[tokens[-1]]], device=device), past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


@torch.no_grad()
def forced_errors(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """Per step, max |Δlogit| / max |logit| of the FP8 cache against the compute dtype's, both fed ``tokens``."""
    device = next(model.parameters()).device
    caches = {kv: new_cache(model.config, kv) for kv in ("auto", "fp8_e4m3")}
    errors, feed = [], prompt
    for token in [None, *tokens[:-1]]:
        ids = torch.tensor([feed if token is None else [token]], device=device)
        logits = {}
        for kv, cache in caches.items():
            logits[kv] = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()
        errors.append(float((logits["fp8_e4m3"] - logits["auto"]).abs().max() / logits["auto"].abs().max()))
    return errors


def measure(name: str, path: Path, args) -> str:
    model = load_model(path, device=args.device, dtype=getattr(torch, args.dtype))
    vocab = int(model.config.vocab_size)
    same, prefix, errors = 0, [], []
    for prompt in prompts(vocab, args.prompts, args.prompt_tokens):
        exact, fp8 = greedy(model, prompt, args.new_tokens, "auto"), greedy(model, prompt, args.new_tokens, "fp8_e4m3")
        same += exact == fp8
        first = next((i for i, (a, b) in enumerate(zip(exact, fp8)) if a != b), len(exact))
        prefix.append(first / len(exact))
        errors += forced_errors(model, prompt, exact)
    per_token = kv_token_bytes(model)
    fp8_bytes = per_token // next(model.parameters()).element_size()
    return (f"{name:<28} {same}/{args.prompts:<9} {statistics.mean(prefix):>11.0%}  {statistics.median(errors):>12.4f}  "
            f"{max(errors):>10.4f}  {per_token:>8,} → {fp8_bytes:,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="a checkpoint (default: the bundled demo model and a tiny random Nano)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"FP8 KV cache (per-tensor scale 1.0) against the {args.dtype} cache on {args.device}: {args.prompts} random prompts of "
          f"{args.prompt_tokens} tokens, {args.new_tokens} greedy tokens; torch {torch.__version__}")
    print(f"{'model':<28} {'identical':<11} {'same prefix':>11}  {'median error':>12}  {'max error':>10}  KV bytes/token")
    with tempfile.TemporaryDirectory(prefix="memt-bench-kv-") as scratch:
        if args.model_path:
            models = [(Path(args.model_path).name, Path(args.model_path))]
        else:
            from memt_core.tiny import make_tiny_checkpoint

            models = [("bundled memt-tiny-demo", Path("memt_core/bundled/memt-tiny-demo")),
                      ("tiny random memt-nano", make_tiny_checkpoint(Path(scratch) / "nano", "memt-nano"))]
        for name, path in models:
            print(measure(name, path, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
