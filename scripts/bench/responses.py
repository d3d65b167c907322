#!/usr/bin/env python
"""Responses API input tokens per turn, with latent memory and without, side by side.

Starts a memt_core server and ``python -m memt_proxy`` (the bundled demo model unless ``--model-path``)
and plays one conversation two ways with the official ``openai`` SDK, turn by turn:

* **memory**: ``client.responses.create(conversation=<id>, input=<new message>)``, the way an app uses
  OpenAI's stateful Responses API; the proxy commits each turn to the conversation's memory session;
* **no memory**: the same app keeping its own transcript and sending all of it as ``input`` each turn
  (``store=False``): what the model reads when the conversation is not in memory (and what OpenAI
  bills as input for a stateful conversation, which it re-reads server side).

Prints ``usage.input_tokens`` per turn of each (flat with memory, growing without) and the totals.

    PYTHONPATH=. python scripts/bench/responses.py                 # 21 turns on the demo model
    PYTHONPATH=. python scripts/bench/responses.py --turns 50 --max-output-tokens 64
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy import HOST, ROOT, free_port, start, stop  # noqa: E402  (the sibling bench's server helpers)

MESSAGES = ["I live in Lisbon.", "What is 2 plus 3?", "Tell me something nice.", "What is the weather like today?", "Please repeat: blue sky.", "Thanks!"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint to serve (default: the bundled demo model)")
    parser.add_argument("--device", default="cpu", help="memt_core --device")
    parser.add_argument("--turns", type=int, default=21, help="turns of the conversation")
    parser.add_argument("--max-output-tokens", type=int, default=48, help="max_output_tokens per response")
    args = parser.parse_args(argv)

    from openai import OpenAI

    from memt_core.bundled import BUNDLED_MODEL

    model_path = Path(args.model_path) if args.model_path else BUNDLED_MODEL
    work = Path(tempfile.mkdtemp(prefix="memt-bench-responses-"))
    core_url, proxy_url = f"http://{HOST}:{free_port()}", f"http://{HOST}:{free_port()}"
    core = start([sys.executable, "-m", "memt_core.launch", "--model-path", str(model_path), "--host", HOST, "--port", core_url.rsplit(":", 1)[1],
                  "--state-directory", str(work / "state"), "--device", args.device, "--log-level", "warning"], core_url, work / "core.log")
    proxy = None
    try:
        proxy = start([sys.executable, "-m", "memt_proxy", "--upstream", core_url, "--model-path", str(model_path), "--host", HOST,
                       "--port", proxy_url.rsplit(":", 1)[1], "--log-level", "warning"], proxy_url, work / "proxy.log")
        client = OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        settings = {"model": model, "temperature": 0.0, "max_output_tokens": args.max_output_tokens}
        conversation = client.conversations.create()
        transcript: list[dict] = []
        print(f"Responses API input tokens per turn: {model} ({model_path.relative_to(ROOT) if model_path.is_relative_to(ROOT) else model_path}), {args.turns} turns")
        print(f"{'turn':>4}  {'memory':>7}  {'no memory':>9}")
        totals = [0, 0]
        for turn in range(args.turns):
            text = MESSAGES[turn % len(MESSAGES)]
            with_memory = client.responses.create(conversation=conversation.id, input=text, **settings)
            transcript.append({"role": "user", "content": text})
            without = client.responses.create(input=transcript, store=False, **settings)
            transcript.append({"role": "assistant", "content": without.output_text})
            totals[0] += with_memory.usage.input_tokens
            totals[1] += without.usage.input_tokens
            print(f"{turn + 1:>4}  {with_memory.usage.input_tokens:>7}  {without.usage.input_tokens:>9}", flush=True)
        print(f"total {totals[0]:>6}  {totals[1]:>9}   (memory reads {totals[0] / totals[1]:.0%} of the tokens)")
    finally:
        if proxy is not None:
            stop(proxy)
        stop(core)
    return 0


if __name__ == "__main__":
    sys.exit(main())
