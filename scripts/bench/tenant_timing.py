#!/usr/bin/env python
"""Does tenant B learn from latency that tenant A sent a transcript? (issue 58 item 6)

Starts the one-process proxy (``--embedded``) with two API keys on the bundled demo model (or ``--model-path``).
Tenant A holds ``--conversations`` header-less conversations of three turns. Tenant B then sends A's exact last
transcripts and, in one random order with them, transcripts of the same shape with one name changed (A never sent
those), each answered with exactly ``--tokens`` completion tokens (``min_tokens`` = ``max_tokens``, greedy). Prints
B's latency medians for both kinds side by side, per round and over all rounds, and B's prompt tokens (equal:
no state is shared). Nothing shared across tenants may be warm for A's text: the medians must stay within noise.

    PYTHONPATH=. python scripts/bench/tenant_timing.py                      # bundled demo model, CPU
    PYTHONPATH=. python scripts/bench/tenant_timing.py --rounds 3 --model-path CHECKPOINT --core-args "--device cuda"
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from demo import free_port, start  # noqa: E402  (the demo's: start a server process, wait for its /health)

KEYS = {"bench-key-a": "tenant-a", "bench-key-b": "tenant-b"}
NAMES = ["Ottilie", "Radomir", "Wojciech", "Thandiwe", "Oluwaseun", "Beatrix", "Cosima", "Leopold", "Svetlana", "Anselm",
         "Ingeborg", "Casimir", "Philippa", "Evander", "Marisol", "Tiberius", "Rosalind", "Benedikt", "Araminta", "Lysander"]
NAMES = [f"{first} {last}" for last in ("Bergstrom", "Okafor", "Lindqvist", "Moreau", "Takahashi") for first in NAMES]


def opening(name: str) -> str:
    return f"Hi, my name is {name} and I live in Samarkand with my parrot."


MODEL = {"name": ""}  # the served model's name, asked once


def ask(http, key: str, messages: list[dict], tokens: int) -> tuple[float, dict]:
    body = {"model": MODEL["name"], "messages": messages, "temperature": 0.0, "max_tokens": tokens, "min_tokens": tokens}
    began = time.perf_counter()
    response = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    seconds = time.perf_counter() - began
    response.raise_for_status()
    return seconds, response.json()


def conversation(http, key: str, name: str, tokens: int) -> list[dict]:
    """Tenant A's three-turn header-less conversation; its last transcript (answered)."""
    history: list[dict] = []
    for text in (opening(name), "What do parrots like to eat?", "And what is my name?"):
        history.append({"role": "user", "content": text})
        _, body = ask(http, key, history, tokens)
        history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return history[:-1]  # the last request A sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-path", default=str(ROOT / "memt_core/bundled/memt-tiny-demo"), help="checkpoint to serve")
    parser.add_argument("--core-args", default="--device cpu --max-sessions-per-rank 128", help="flags of the embedded core")
    parser.add_argument("--conversations", type=int, default=10, help="tenant A's conversations per round (n per kind)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each with new names")
    parser.add_argument("--tokens", type=int, default=12, help="completion tokens of every answer")
    parser.add_argument("--seed", type=int, default=0, help="the order of B's requests")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.conversations * args.rounds > len(NAMES):
        parser.error(f"at most {len(NAMES)} conversations over all rounds")

    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    keys = Path(tempfile.mkstemp(prefix="bench-tenants-", suffix=".json")[1])
    keys.write_text(json.dumps(KEYS))
    log = Path(tempfile.mkstemp(prefix="bench-tenant-timing-", suffix=".log")[1])
    proxy = start(["-m", "memt_proxy", "--embedded", "--port", str(port), "--model-path", args.model_path, "--core-args", args.core_args,
                   "--api-keys-file", str(keys), "--log-level", "warning"], url, log, "proxy")
    key_a, key_b = KEYS
    from memt_core.client.chat_format import load_tokenizer

    tokenizer = load_tokenizer(args.model_path)

    def twin(name: str) -> str:
        """``name`` with its first letter changed (a name A never sent) whose opening has as many tokens as ``name``'s:
        the two prompts are the same size."""
        size = len(tokenizer.encode(opening(name)))
        for letter in "BDGKMPRSTVLNHFJ":
            other = letter + name[1:]
            if other != name and other not in NAMES and len(tokenizer.encode(opening(other))) == size:
                return other
        raise SystemExit(f"no one-letter change of {name!r} tokenizes to as many tokens")

    shuffle = random.Random(args.seed)
    rounds = []
    try:
        with httpx.Client(base_url=url, timeout=300) as http:
            MODEL["name"] = http.get("/v1/models", headers={"Authorization": f"Bearer {key_a}"}).json()["data"][0]["id"]
            ask(http, key_b, [{"role": "user", "content": "Warm up."}], args.tokens)  # B's first request pays no one-off costs
            for number in range(args.rounds):
                names = NAMES[number * args.conversations: (number + 1) * args.conversations]
                sent = [conversation(http, key_a, name, args.tokens) for name in names]
                changed = [[{**m, "content": m["content"].replace(name, twin(name))} for m in transcript] for name, transcript in zip(names, sent)]
                order = [("sent", t) for t in sent] + [("changed", t) for t in changed]
                shuffle.shuffle(order)
                seconds: dict[str, list[float]] = {"sent": [], "changed": []}
                prompts: dict[str, list[int]] = {"sent": [], "changed": []}
                completions: set[int] = set()
                for kind, transcript in order:
                    took, body = ask(http, key_b, transcript, args.tokens)
                    seconds[kind].append(took)
                    prompts[kind].append(body["usage"]["prompt_tokens"])
                    completions.add(body["usage"]["completion_tokens"])
                rounds.append({kind: {"median_ms": round(1000 * statistics.median(values), 1), "prompt_tokens": statistics.median(prompts[kind])}
                               for kind, values in seconds.items()} | {"completion_tokens": sorted(completions), "seconds": seconds})
                row = rounds[-1]
                print(f"round {number + 1}: B on A's transcripts {row['sent']['median_ms']:7.1f} ms   on changed ones "
                      f"{row['changed']['median_ms']:7.1f} ms   (prompt tokens {row['sent']['prompt_tokens']:.0f} / "
                      f"{row['changed']['prompt_tokens']:.0f}, completion tokens {row['completion_tokens']}, n = {args.conversations} each)", flush=True)
    finally:
        proxy.terminate()
        proxy.wait(30)
    every = {kind: [s for row in rounds for s in row["seconds"][kind]] for kind in ("sent", "changed")}
    print(f"all rounds: B on A's transcripts {1000 * statistics.median(every['sent']):7.1f} ms   on changed ones "
          f"{1000 * statistics.median(every['changed']):7.1f} ms   (n = {len(every['sent'])} each)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
