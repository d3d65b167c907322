#!/usr/bin/env python
"""Average the weights of demo checkpoints trained on from one checkpoint (a uniform "model soup").

    python scripts/average_checkpoints.py --out DIR RUN_A RUN_B [RUN_C ...]

Runs that continue the same checkpoint (``train_tiny.py --init-from``) with other seeds or data stay close
in weight space, and their mean often generalises better than either. The runs must share shape,
tokenizer and the chain of runs before them (their ``training.json`` says so); the output has the first
run's tokenizer, config and template, the mean of the weights in their stored dtype, and a
``training.json`` that records this command, each averaged run's own record, and the shared chain.
Evaluate it like any checkpoint: ``python scripts/train_tiny.py --eval-only --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def average(runs: list[Path], out: Path, command: str) -> dict:
    """Write the mean of ``runs``' weights into ``out``; return its training record."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from memt_demo.train import run_minutes

    records = [json.loads((run / "training.json").read_text()) for run in runs]
    for run, record in zip(runs[1:], records[1:]):
        if record["config"]["shape"] != records[0]["config"]["shape"]:
            raise SystemExit(f"error: {run} has another model shape than {runs[0]}")
        if record.get("continues", []) != records[0].get("continues", []):
            raise SystemExit(f"error: {run} does not continue the same chain of runs as {runs[0]}")
        if (run / "tokenizer.json").read_bytes() != (runs[0] / "tokenizer.json").read_bytes():
            raise SystemExit(f"error: {run} has another tokenizer than {runs[0]}")
    out.mkdir(parents=True, exist_ok=True)
    for item in runs[0].iterdir():
        if item.is_file() and item.name not in ("model.safetensors", "training.json", "eval.json", "README.md"):
            shutil.copy(item, out / item.name)
    with safe_open(runs[0] / "model.safetensors", "pt") as first:
        metadata, names = first.metadata(), list(first.keys())
    handles = [safe_open(run / "model.safetensors", "pt") for run in runs]
    mean = {}
    for name in names:
        tensors = [h.get_tensor(name) for h in handles]
        mean[name] = (torch.stack([t.float() for t in tensors]).mean(0)).to(tensors[0].dtype)
    save_file(mean, out / "model.safetensors", metadata=metadata)
    chain = records[0].get("continues", [])
    record = {
        "command": command,
        "minutes": 0.0,
        "config": records[0]["config"],
        "averages": records,
        "continues": chain,
        "minutes_total": round(sum(map(run_minutes, chain)) + sum(map(run_minutes, records)), 1),
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory of the averaged checkpoint")
    parser.add_argument("runs", type=Path, nargs="+", help="checkpoint directories written by train_tiny.py")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two checkpoints to average")
    command = "python scripts/average_checkpoints.py " + " ".join(sys.argv[1:] if argv is None else argv)
    record = average(args.runs, args.out, command)
    print(f"averaged {len(args.runs)} checkpoints into {args.out} ({record['minutes_total']} training minutes in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
