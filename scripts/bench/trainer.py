#!/usr/bin/env python
"""Time the demo trainer's step: the reference (``memt_demo.train.episode_loss``) against the batched one
(``memt_demo.batched.batched_episode_loss``), on the same batches, in one run.

A step is what ``memt_demo.train.train`` does per batch: the loss, its backward, gradient clipping and an
AdamW step. Both trainers start from the same weights and see the same batch (one per repetition, drawn from
the full mix by default), alternating A B A B so that other load on the machine falls on both alike; printed:
the median step time and steps/s of each, their ratio, the losses' largest relative difference, and the
aten operations dispatched per step (forward and backward: each is a kernel launch on a GPU, where a step
of small operations is bound by launches rather than arithmetic). Last, a bound no trainer of this model
can beat: one forward and backward over as many tokens as the step's episodes hold, in rows of 128 with no
memory dependency and no padding (the arithmetic of the step, without its sequence).

    PYTHONPATH=. python scripts/bench/trainer.py                            # batch 16, the bundled model's shape
    PYTHONPATH=. python scripts/bench/trainer.py --batch-size 16 64 --repeats 5
    PYTHONPATH=. python scripts/bench/trainer.py --device cuda --batch-size 256

The issue's target (#47): batched ≥ 5× the reference at batch 16 on CPU.
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

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from memt_demo import BUNDLED_MODEL  # noqa: E402

TARGET_RATIO, TARGET_BATCH = 5.0, 16


class _OpCount(TorchDispatchMode):
    """Counts the aten operations dispatched while active (backward included: CPU autograd runs on this thread)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[TARGET_BATCH], help="episodes per step (several: one line each)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps of each trainer (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of each trainer first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as training runs here)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", type=Path, default=BUNDLED_MODEL,
                        help="a checkpoint whose tokenizer and shape to use (fresh weights, as training from scratch)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the episodes and the weights")
    parser.add_argument("--slack", type=slack_value, default="auto",
                        help="the batched trainer's padding groups: a number (memt_demo.batched.COMMIT_SLACK), 'none' "
                             "(one forward per commit index) or 'auto' (its default for the device)")
    parser.add_argument("--warm-up-mix", action="store_true", help="episodes of the curriculum's warm-up mix instead of the full mix")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this PyTorch sees no GPU")
    torch.set_num_threads(args.threads)

    from transformers import PreTrainedTokenizerFast

    from memt_demo.batched import batched_episode_loss
    from memt_demo.episodes import EpisodeSampler, Mix
    from memt_demo.format import DemoChatFormat
    from memt_demo.train import TrainConfig, episode_loss, init_model

    config = TrainConfig(seed=args.seed, device=args.device)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(args.model))
    fmt = DemoChatFormat(tokenizer, value_weight=config.value_weight)
    mix = Mix.warm_up() if args.warm_up_mix else Mix()
    trainers = {"reference": episode_loss, "batched": lambda model, batch: batched_episode_loss(model, batch, slack=args.slack)}
    print(f"demo trainer step (loss + backward + AdamW) on {args.device}, {args.threads} thread(s), slack {args.slack}, "
          f"{'warm-up' if args.warm_up_mix else 'full'} mix, shape of {args.model.name}; median of {args.repeats}")
    met = None
    for size in args.batch_size:
        sampler = EpisodeSampler(args.seed)
        models, optimizers = {}, {}
        for name in trainers:  # the same initial weights for both
            models[name] = init_model(args.model, config).to(args.device).train()
            optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=config.lr)
        chunk = models["reference"].checkpoint.memory.chunk_tokens
        seconds: dict[str, list[float]] = {name: [] for name in trainers}
        losses: dict[str, list[float]] = {name: [] for name in trainers}
        tokens = 0
        for rep in range(args.warmup + args.repeats):
            batch = [fmt.episode(sampler.sample(mix), chunk, reply_weight=config.reply_weight) for _ in range(size)]
            for name, loss_fn in trainers.items():
                model, optimizer = models[name], optimizers[name]
                _sync(args.device)
                start = time.perf_counter()
                loss, stats = loss_fn(model, batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                _sync(args.device)
                if rep >= args.warmup:
                    seconds[name].append(time.perf_counter() - start)
                    losses[name].append(stats.loss)
            tokens += stats.tokens if rep >= args.warmup else 0
        ops = {}
        batch = [fmt.episode(sampler.sample(mix), chunk, reply_weight=config.reply_weight) for _ in range(size)]
        for name, loss_fn in trainers.items():
            with _OpCount() as counter:
                loss, _ = loss_fn(models[name], batch)
                loss.backward()
            ops[name] = counter.count
        step = {name: statistics.median(s) for name, s in seconds.items()}
        bound = _bound_seconds(models["batched"], tokens // args.repeats, args.repeats, args.device)
        ratio = step["reference"] / step["batched"]
        # the weights diverge slowly over the steps (float order); the first timed step's losses are on equal weights
        differ = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(losses["reference"], losses["batched"]))
        print(f"batch {size:4d} ({tokens / args.repeats:.0f} tokens/step): "
              + "  ".join(f"{name} {step[name]:.3f} s/step = {1 / step[name]:.2f} steps/s, {ops[name]} ops" for name in trainers)
              + f"  | batched/reference {ratio:.2f}x (losses differ ≤ {differ:.1e} relative)"
              + f"  | bound {bound:.3f} s/step = {step['reference'] / bound:.1f}x the reference", flush=True)
        if size == TARGET_BATCH and args.device == "cpu":
            met = ratio >= TARGET_RATIO
    if met is not None:
        print(f"target (issue #47): batched ≥ {TARGET_RATIO:.0f}x the reference at batch {TARGET_BATCH} on CPU: "
              + ("met" if met else "NOT met"))
    return 0


def slack_value(text: str) -> float | None | str:
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slack wants a number, 'none' or 'auto'; got {text!r}") from None


def _bound_seconds(model, tokens: int, repeats: int, device: str) -> float:
    """Median time of one forward + backward over ``tokens`` tokens in rows of 128, reading a zero memory and
    collecting the writes (everything a step computes per token, none of its sequence)."""
    from memt_demo.loss import HiddenStates

    rows = max(1, tokens // 128)
    ids = torch.randint(0, model.config.vocab_size, (rows, 128), device=device)
    shape = model.checkpoint.memory.state_shape()[1:]
    memory = {layer: torch.zeros(rows, *shape, device=device) for layer in model.memory_layers}
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        with HiddenStates(model):
            out = model(ids, memory=memory, collect_writes=True)
        total = out.logits.square().mean() + sum(w.k.sum() + w.v.sum() + w.g.sum() + w.beta.sum() for w in out.writes.values())
        model.zero_grad(set_to_none=True)
        total.backward()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
