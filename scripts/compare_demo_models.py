#!/usr/bin/env python
"""Compare demo models as a user meets them (issue 57's gate for a new default): each model served by a real core
and proxy on 127.0.0.1, driven by the OpenAI SDK (named sessions) and the native client (the seed's examples).

    python scripts/compare_demo_models.py                                        # the bundled model alone
    python scripts/compare_demo_models.py memt_core/bundled/memt-tiny-demo runs/demo-v4/smol-m4 --out report.json
    python scripts/compare_demo_models.py runs/demo-v4/smol-m4 --quick            # fewer conversations

The cases and how each counts are in :mod:`memt_demo.compare`. For a checkpoint on an external backbone
(memt-smol) the plain questions are also answered by the backbone alone (transformers' causal LM on the same
weights and prompt, greedy), and ``plain_backbone_same`` counts the answers that are the same text.
Prints one table, the models side by side; ``--out`` writes the report as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

CASES = ("names", "seed_examples", "repeat", "chatter30", "wrong_fact", "plain", "plain_backbone_same")


def backbone_reference(model_path: Path, chat_format, parser):
    """The backbone's own greedy answer to a plain question, or None for a model without an external backbone."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from memt_core.checkpoint import backbone_config, read_checkpoint

    checkpoint = read_checkpoint(model_path)
    files = checkpoint.family.backbone_weights(checkpoint.path, checkpoint.config)
    if not files:
        return None
    plain = LlamaForCausalLM(backbone_config(checkpoint)).float().eval()
    plain.load_state_dict({k: v.float() for k, v in load_file(str(files[0])).items()})

    def answer(question: str) -> str:
        ids = torch.tensor([chat_format.conversation_ids([{"role": "user", "content": question}])])
        with torch.no_grad():
            out = plain.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=sorted(chat_format.end_ids))
        return parser.parse(chat_format.decode(out[0, ids.shape[1]:].tolist())).content

    return answer


def compare(model_path: Path, args) -> dict:
    from openai import OpenAI

    from e2e.proxies import ProxyServer
    from e2e.servers import MemTServer
    from memt_core.checkpoint import read_checkpoint
    from memt_core.client import NativeClient, load_chat_format, load_tokenizer
    from memt_demo.compare import Comparison

    name = read_checkpoint(model_path, validate_backbone=False).served_name
    chat_format, parser = load_chat_format(model_path, tokenizer=load_tokenizer(model_path),
                                           chat_template_kwargs={"enable_thinking": False})
    started = time.time()
    core = MemTServer(model_path, args=["--max-sessions-per-rank", "256"]).start()
    try:
        with ProxyServer(core.url, model_path) as proxy:
            comparison = Comparison(OpenAI(base_url=proxy.base_url, api_key="unused", timeout=600), name,
                                    NativeClient(core.url), chat_format, parser, seed=args.seed,
                                    reference=backbone_reference(model_path, chat_format, parser))
            report = comparison.run(names=args.names, chatter=args.chatter, wrong=args.wrong,
                                    log=lambda line: print(line, flush=True))
    finally:
        core.close()
    return {"model": name, "path": str(model_path), "seconds": round(time.time() - started), "cases": report}


def table(reports: list[dict]) -> str:
    lines = ["| case | " + " | ".join(r["model"] for r in reports) + " |", "|---|" + "---|" * len(reports)]
    for case in CASES:
        cells = []
        for report in reports:
            found = report["cases"].get(case)
            cells.append(f"{found['passed']}/{found['total']} ({found['rate']:.0%})" if found else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from memt_core.bundled import BUNDLED_MODEL

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, default=[BUNDLED_MODEL], help="checkpoint directories (default: the bundled model)")
    parser.add_argument("--seed", type=int, default=777, help="seed of the drawn values and phrasings (default: 777)")
    parser.add_argument("--names", type=int, default=40, help="name conversations (default: 40)")
    parser.add_argument("--chatter", type=int, default=8, help="conversations with 30 chatter turns (default: 8)")
    parser.add_argument("--wrong", type=int, default=12, help="wrong-fact conversations (default: 12)")
    parser.add_argument("--quick", action="store_true", help="12 names, 2 long chats, 6 wrong facts")
    parser.add_argument("--out", type=Path, default=None, help="write the reports as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.names, args.chatter, args.wrong = 12, 2, 6
    reports = [compare(path, args) for path in args.models]
    print(table(reports))
    for report in reports:
        for case, found in report["cases"].items():
            for failure in found["failures"][:2]:
                print(f"  {report['model']} {case} ✗ {failure[:200]}")
    if args.out:
        args.out.write_text(json.dumps({"seed": args.seed, "reports": reports}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
