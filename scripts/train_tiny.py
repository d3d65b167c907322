#!/usr/bin/env python
"""Train the bundled demo model: a tiny MemT of the Nano architecture that recalls from latent memory.

    python scripts/train_tiny.py                       # → memt_core/bundled/memt-tiny-demo/
    python scripts/train_tiny.py --out /tmp/demo --steps 300 --eval-episodes 50

Everything runs on CPU. The script builds the tokenizer (a byte-level BPE trained on the synthetic
corpus, saved in Hugging Face format with the Nano chat template), writes ``config.json``
(``model_type: memt_qwen3_5_moe``, loaded by ``memt_core.models.load_model`` like real Nano
checkpoints), trains on synthetic episodes (:mod:`memt_demo.episodes`) through the engine's commit
→ write → query-reads-memory path with gradients through the write, saves BF16 safetensors, and ends
with the recall evaluation of ``scripts/eval_tiny.py`` on fresh random episodes.

Run time: see ``training.json`` of the bundled checkpoint for the exact command and its duration. On a
2-core machine shared with other work, ``--threads 1`` (with ``OMP_NUM_THREADS=1``) was several times
faster than ``--threads 2``: two threads spin against other processes for the same cores. The final
evaluation runs every case on the in-distribution and the held-out split (10-20 minutes on one core).

Reproducible: the data, initialisation and order are seeded by ``--seed``; the same seed and
``--threads`` give the same checkpoint on the same machine and library versions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memt_demo.episodes import Mix  # noqa: E402
from memt_demo.train import Curve, TrainConfig, chain_entry, run_minutes  # noqa: E402

from memt_demo import BUNDLED_MODEL as DEFAULT_OUT  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"checkpoint directory (default: {DEFAULT_OUT})")
    parser.add_argument("--steps", type=int, default=defaults.steps, help=f"training steps (default: {defaults.steps})")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="episodes per step")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of data, initialisation and order")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where to train: cpu (default) or cuda (a GPU; FP32, not bit-reproducible there, and "
                             "larger --batch-size pays off); the checkpoint and its final evaluation are on the CPU either way")
    parser.add_argument("--batched", action="store_true",
                        help="compute the loss with memt_demo.batched: the batch's memory in one tensor, its commits "
                             "padded and run one commit index at a time (the same loss as the default per-episode "
                             "trainer within float tolerance, tests/demo/test_batched_trainer.py; "
                             "scripts/bench/trainer.py times both)")
    parser.add_argument("--eval-episodes", type=int, default=200, help="episodes of the final recall eval (0: skip)")
    parser.add_argument("--eval-seed", type=int, default=1234, help="seed of the eval's fresh episodes")
    parser.add_argument("--log-every", type=int, default=defaults.log_every, help="steps between progress lines")
    parser.add_argument("--time-limit-min", type=float, default=None,
                        help="safety stop: save and stop after this many minutes even if steps remain")
    parser.add_argument("--schedule-by-time", action="store_true",
                        help="with --time-limit-min: the curriculum and the learning-rate decay follow the larger of the "
                             "step and the time fraction, so a slow (shared) machine still completes them in time; "
                             "the log records the steps reached")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="continue training this checkpoint (its tokenizer, config and weights) instead of a new "
                             "model; the shape options are then ignored")
    parser.add_argument("--warm-up", type=float, default=0.2, help="fraction of training on single facts (curriculum)")
    parser.add_argument("--full-mix", type=float, default=0.5, help="fraction of training where the full mix is reached")
    parser.add_argument("--mix", nargs="*", default=[], metavar="FIELD=VALUE", type=mix_override,
                        help="change a field of the full mix (memt_demo.episodes.Mix), e.g. unknown=0.02 "
                             "(a kind's weight) or max_facts=4; the curriculum then blends towards it")
    shape = defaults.shape
    parser.add_argument("--vocab-size", type=int, default=shape.vocab_size, help="tokenizer vocabulary target")
    parser.add_argument("--hidden-size", type=int, default=shape.hidden_size, help="backbone width")
    parser.add_argument("--memory-heads", type=int, default=shape.memory_heads, help="memory heads per memory layer")
    parser.add_argument("--key-dim", type=int, default=shape.key_dim, help="memory key dimension")
    parser.add_argument("--value-dim", type=int, default=shape.value_dim, help="memory value dimension")
    parser.add_argument("--memory-layers", type=int, nargs="+", default=list(shape.memory_layers),
                        help=f"backbone layers that carry memory, 0 … {shape.layers - 1} "
                             f"(default: {' '.join(map(str, shape.memory_layers))})")
    parser.add_argument("--eval-only", action="store_true",
                        help="do not train: evaluate the checkpoint in --out (its training.json) and write eval.json + README.md")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: this PyTorch sees no GPU (torch.cuda.is_available() is False)")
    if args.eval_only:
        record = json.loads((args.out / "training.json").read_text())
        config = config_from_dict(record["config"])
        write_evaluation(args.out, args.eval_episodes, args.eval_seed, record.get("minutes_total", record["minutes"]), config,
                         threads=args.threads, averaged=len(record.get("averages", [])))
        return 0

    from memt_demo.train import train

    if not all(0 <= layer < defaults.shape.layers for layer in args.memory_layers) or len(set(args.memory_layers)) < len(args.memory_layers):
        parser.error(f"--memory-layers: distinct layer indices from 0 to {defaults.shape.layers - 1}")
    shape = replace(defaults.shape, vocab_size=args.vocab_size, hidden_size=args.hidden_size, memory_heads=args.memory_heads,
                    key_dim=args.key_dim, value_dim=args.value_dim, memory_layers=tuple(sorted(args.memory_layers)))
    config = replace(defaults, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                     threads=args.threads, device=args.device, log_every=args.log_every, batched=args.batched, shape=shape)
    print(f"training the demo model into {args.out} ({config.steps} steps × {config.batch_size} episodes, "
          f"{config.threads} thread(s), seed {config.seed}{', batched trainer' if config.batched else ''})", flush=True)
    started = time.time()
    log = Curve()

    full = Mix(**dict(args.mix))

    def mix_for(progress: float) -> Mix:
        return Mix.curriculum(progress, warm=args.warm_up, full=args.full_mix, end=full)

    if args.init_from is not None:
        shape = config_from_dict(json.loads((args.init_from / "training.json").read_text())["config"]).shape
        config = replace(config, shape=shape)
    train(config, args.out, log=log, mix_for=mix_for, time_limit_s=args.time_limit_min * 60 if args.time_limit_min else None,
          schedule_by_time=args.schedule_by_time, init_from=args.init_from)
    minutes = (time.time() - started) / 60
    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"trained in {minutes:.1f} min; checkpoint {args.out} ({size / 1e6:.1f} MB)", flush=True)
    record = {"command": "python scripts/train_tiny.py " + " ".join(map(str, sys.argv[1:] if argv is None else argv)),
              "minutes": round(minutes, 1), "config": asdict(config), "learning_curve": log.lines}
    if args.init_from is not None:  # the run it continues: its command first, so the chain can be replayed
        before = json.loads((args.init_from / "training.json").read_text())
        record["continues"] = before.get("continues", []) + [chain_entry(before)]
        record["minutes_total"] = round(minutes + sum(map(run_minutes, record["continues"])), 1)
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    if args.eval_episodes:
        write_evaluation(args.out, args.eval_episodes, args.eval_seed, record.get("minutes_total", minutes), config,
                         threads=args.threads)
    return 0


def mix_override(text: str) -> tuple[str, float | int]:
    """``FIELD=VALUE`` of ``--mix``: a field of :class:`Mix` and a value of its type (weights ≥ 0)."""
    name, sep, value = text.partition("=")
    known = [f.name for f in fields(Mix)]
    if not sep or name not in known:
        raise argparse.ArgumentTypeError(f"{text!r} is not FIELD=VALUE with FIELD one of {', '.join(known)}")
    kind = int if isinstance(getattr(Mix, name), int) else float
    try:
        number = kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} takes {'an integer' if kind is int else 'a number'}, not {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{name} must be ≥ 0, not {value}")
    return name, number


def config_from_dict(data: dict) -> TrainConfig:
    """The :class:`TrainConfig` recorded in a ``training.json``."""
    from memt_demo.train import ModelShape

    shape = ModelShape(**{**data["shape"], "memory_layers": tuple(data["shape"]["memory_layers"])})
    return TrainConfig(**{**data, "shape": shape})


def write_evaluation(out: Path, episodes: int, seed: int, minutes: float, config: TrainConfig, *, threads: int, averaged: int = 0) -> dict:
    """Evaluate the checkpoint in ``out`` on both splits; write its ``eval.json`` and model card ``README.md``."""
    from memt_demo.eval import evaluate, format_report

    report = evaluate(out, episodes, seed, threads=threads)
    report["command"] = f"python scripts/eval_tiny.py --episodes {episodes} --seed {seed}"
    print(format_report(report), flush=True)
    record = {"command": report["command"], "seconds": report["seconds"], "targets": report["targets"],
              "splits": {name: {k: split[k] for k in ("figures", "counts")} for name, split in report["splits"].items()}}
    (out / "eval.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "README.md").write_text(model_card(report, minutes, config, averaged))
    return report


def held_out_notes(splits: dict) -> str:
    """Where the held-out column falls behind, in words and with the evaluation's own wrong answers."""
    ind, held = splits["in_distribution"]["figures"], splits["heldout"]["figures"]
    lines = []
    if "fact1_values" in held and "fact1" in held:
        cause = ("New values are copied out of memory; new phrasings are what it fails on."
                 if held["fact1_values"] - held["fact1"] >= 0.1 else
                 "New phrasings cost little beyond what new values cost.")
        lines.append(
            f"- Never-seen values told and asked with *training* phrasings are recalled in {held['fact1_values']:.0%} "
            f"of cases ({ind['fact1_values']:.0%} for in-distribution values); with held-out phrasings as well, "
            f"{held['fact1']:.0%}. {cause}")
    gaps = [(ind[n] - held[n], n) for n in LABELS_FOR_GAPS if n in held and n in ind]
    worst = [n for gap, n in sorted(gaps, reverse=True) if gap >= 0.2]
    if worst:
        from memt_demo.eval import LABELS

        lines.append("- The largest drops from in distribution to held out: " + "; ".join(
            f"{LABELS[n]} {ind[n]:.0%} → {held[n]:.0%}" for n in worst) + ".")
    examples = [text for name, shown in splits["heldout"].get("examples", {}).items() if name.endswith("_wrong") for text in shown[:1]]
    if examples:
        lines.append("- Wrong held-out answers from this evaluation:\n" + "\n".join(f"  - `{e[:160]}`" for e in examples[:8]))
    if worst:
        lines.append("- A user who phrases things like its training templates gets answers like the in-distribution column; "
                     "other phrasings often get a wrong or unrelated answer.")
    return "\n".join(lines)


LABELS_FOR_GAPS = ("fact1", "facts3", "phrasing", "document", "tool_call_correct", "tool_answer_json", "tool_answer_text",
                   "tool_from_memory", "repeat_exact")


def model_card(report: dict, minutes: float, config, averaged: int = 0) -> str:
    """README.md of the checkpoint: what it is, what it can and cannot do, how it was made and measured."""
    from memt_demo.eval import LABELS, TARGETS, target_name

    splits = report["splits"]
    names = [n for n in LABELS if n in splits["heldout"]["figures"]]
    rows = "\n".join(
        f"| {LABELS[name]} | " + " | ".join(
            f"{splits[s]['figures'][name]:.1%} (n={splits[s]['counts'][name]})" for s in ("in_distribution", "heldout")
        ) + " |"
        for name in names
    )
    met = [target_name(*t) for t in TARGETS if report["targets"].get(target_name(*t))]
    missed = [target_name(*t) for t in TARGETS if target_name(*t) in report["targets"] and not report["targets"][target_name(*t)]]
    shape = config.shape
    made = "`scripts/train_tiny.py`" + (f" (then {averaged} runs averaged by `scripts/average_checkpoints.py`)" if averaged else "")
    return f"""# memt-tiny-demo

A tiny MemT of the Nano architecture (`memt_qwen3_5_moe`: a {shape.layers}-layer, {shape.hidden_size}-wide Qwen3.5-MoE
backbone with latent memory on layers {list(shape.memory_layers)}, {shape.memory_heads} memory heads of
{shape.key_dim} × {shape.value_dim}), trained by {made} on synthetic conversations in
{minutes:.0f} minutes on CPU. It exists to show — and test — latent memory on any machine.

**It is not a general assistant.** It has a handful of skills, learned from synthetic data:

1. personal facts told in one turn (name, age, city, address, favourite food and colour, pet, a pet's
   name, job, employer, personality, hobby, best friend, birthday, a code) and asked about in a later
   turn: *"I have a parrot named Belkavo."* … *"What is my parrot's name?"* → *"Your parrot is called
   Belkavo."* Values are open: made-up names, random strings, multi-word cities and addresses, codes and
   dates are copied piece by piece out of memory. With an empty memory it answers *"I don't know …"*;
2. a company profile ingested through memory, then questions about it;
3. tool calls for `get_weather(city)`, `add(a, b)` and `multiply(a, b)` in the chat template's
   `<tool_call>` format (the city may come from memory: *"What's the weather where I live?"*), and an
   answer from the tool's result, given as JSON or as plain text (*"17 degrees and sunny"*);
4. repeating or typing a given text exactly (*"Type 'the cat sat on the mat' exactly."*). Texts shaped like
   its training data come back exact; everyday phrases much less often (*"Type 'hello world' exactly."* comes back
   as *"windas"*; 8 of 32 everyday requests came back exact in `scripts/compare_demo_models.py`);
5. keeping told facts through a long conversation: after turns of chatter (*"Tell me something, number 3."*)
   a fact told early is still found. Its answers to the chatter itself are not neutral: it often invents one
   (*"Tell me something, number 4."* → *"Your birthday is on August 5."*).

Outside these skills, the sentence shapes and the vocabulary of its synthetic data it produces
plausible-looking but wrong text; free-form questions, reasoning and world knowledge are beyond it.

## Evaluation

`{report.get("command", "python scripts/eval_tiny.py")}`: fresh random episodes, greedy decoding,
through the in-process API. Earlier turns are generated by the model and committed to memory;
questions are asked with prompts that contain only the question, so answers come from latent memory
alone. *In distribution*: values and phrasings drawn like the training data (new combinations).
*Held out*: values built from syllables and letters the training generators never use, real names and
cities absent from training, and the ~20 % of every skill's templates that training never saw.

| measure | in distribution | held out |
|---|---|---|
{rows}

Issue targets (held-out split) met: {", ".join(met) or "none"}.
Not met: {", ".join(missed) or "none"}.

## What the held-out figures say

{held_out_notes(splits)}

## Files

`config.json` (with the `memt` memory geometry), `model.safetensors` (BF16), `tokenizer.json`,
`tokenizer_config.json`, `chat_template.jinja` (the Nano chat template: system prompts, thinking on/off,
tools), `training.json` (the exact training command, configuration and learning curve), `eval.json`
(the figures above).
"""


if __name__ == "__main__":
    sys.exit(main())
