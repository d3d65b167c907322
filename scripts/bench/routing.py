#!/usr/bin/env python
"""Which SMG routing keeps header-less conversations on the node that holds their state (issue 49): SMG's
policies side by side in one run, over the same core+proxy pairs.

    python scripts/bench/routing.py [--pairs 3] [--conversations 12] [--turns 6] [--named 6] [--concurrency 4]
                                    [--only NAME ...] [--model-path DIR]

Starts Redis, ``--pairs`` pairs on one snapshot store (as ``bench/cluster.py`` does) and, per routing
configuration, a fresh SMG over them (nothing learnt from the one before). Through it run ``--conversations``
header-less conversations of ``--turns`` turns (no header of any kind; each opens with a name of its own,
greedy answers, ``--concurrency`` conversations at a time), and ``--named`` conversations of 3 turns
under ``X-SMG-Routing-Key``. A header-less turn is counted *from memory* when its prompt is under 0.6 × the
prompt of its whole transcript (what the node reads when it holds no state of the conversation); from turn 3
on, a turn served on the node that kept its conversation's state reads only its new message. Printed per
configuration:

* turns 3+ from memory (of conversations × (turns − 2)); the target is ≥ 95 %;
* the spread: header-less conversations per node (each counted at the node that served most of its turns)
  and the busiest node against the mean (target ≤ 1.5×);
* named sessions on one node: routing-key conversations whose turns all landed on one node (target 100 %),
  and their spread over the nodes (they all open alike: a router that places a new key by its prefix piles
  them onto one node);
* turns/s over the header-less run.

The last two configurations are the chosen one with SMG's balancing knobs, for apps whose conversations
all open with one long system prompt (``--system``): a new conversation then matches that prompt on the node
that served it first. Measured: they trade turns from memory for spread (docs/deployment.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
from bench.cluster import ROUTED, ROUTING, Cluster, say  # noqa: E402

from memt_demo import BUNDLED_MODEL  # noqa: E402

#: the configurations measured: name -> SMG's policy flags. Every one but the first pins X-SMG-Routing-Key.
CONFIGURATIONS = {
    "consistent_hashing (before)": ["--policy", "consistent_hashing"],
    "prefix_hash 16": ["--policy", "prefix_hash", "--prefix-token-count", "16", "--routing-key-override"],
    "prefix_hash 256": ["--policy", "prefix_hash", "--routing-key-override"],
    "cache_aware": ["--policy", "cache_aware", "--routing-key-override"],
    "cache_aware, keys min_group": ["--policy", "cache_aware", "--routing-key-override", "--assignment-mode", "min_group"],
    "chosen (+ no diversion)": ROUTING,
    "chosen, spill 2 over the mean": [*ROUTING, "--balance-abs-threshold", "2", "--balance-rel-threshold", "1.2"],
    "chosen, cache-threshold 0.85": [*ROUTING, "--cache-threshold", "0.85"],
}
MEMORY_SHARE = 0.6  # a turn is from memory when its prompt is under this share of its whole transcript's
NAMES = ["Ottilie", "Odalys", "Bertram", "Lucinda", "Ferdinand", "Ingrid", "Casimir", "Rosalind", "Evander", "Marisol",
         "Thaddeus", "Philippa", "Leopold", "Henrietta", "Augustin", "Seraphina"]
CITIES = ["Samarkand", "Lisbon", "Oslo", "Quito", "Hanoi", "Tbilisi", "Dakar", "Perth"]


def message(conversation: int, turn: int) -> str:
    if turn == 1:
        name = NAMES[conversation % len(NAMES)]
        return f"Hi, my name is {name} {conversation} and I live in {CITIES[conversation % len(CITIES)]}."
    return f"Tell me something, number {turn}."


class Conversation:
    """One app's conversation through the router: the whole history each turn; what each turn cost, where."""

    def __init__(self, url: str, model: str, max_tokens: int, headers: dict[str, str], system: str | None = None):
        self.http = httpx.Client(base_url=url, timeout=300, headers=headers)
        self.model, self.max_tokens = model, max_tokens
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.turns: list[tuple[str, int, int]] = []  # (node, prompt tokens, prompt tokens of the whole transcript)

    def turn(self, text: str, whole) -> None:
        sent = [*self.messages, {"role": "user", "content": text}]
        response = self.http.post("/v1/chat/completions", json={"model": self.model, "messages": sent, "max_tokens": self.max_tokens, "temperature": 0.0})
        response.raise_for_status()
        body = response.json()
        self.messages = [*sent, {"role": "assistant", "content": body["choices"][0]["message"]["content"]}]
        self.turns.append((response.headers.get(ROUTED, "?"), body["usage"]["prompt_tokens"], whole(sent)))


def measure(cluster: Cluster, args, whole) -> dict:
    """One configuration: header-less conversations, then named ones; the figures of the module docstring."""
    headerless = [Conversation(cluster.url, cluster.model, args.max_tokens, {}, args.system) for _ in range(args.conversations)]
    run = uuid.uuid4().hex[:4]  # the configurations share the pairs: no conversation may open as another did

    def talk(item: tuple[int, Conversation]) -> None:
        index, conversation = item
        for t in range(1, args.turns + 1):
            text = message(index, t)
            conversation.turn(f"{text} ({run})" if t == 1 else text, whole)

    started = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(talk, enumerate(headerless)))
    elapsed = time.perf_counter() - started
    later = [(prompt, full) for c in headerless for _, prompt, full in c.turns[2:]]
    homes = Counter(Counter(node for node, _, _ in c.turns).most_common(1)[0][0] for c in headerless)
    per_node = [homes.get(url, 0) for url in cluster.workers]

    named = [Conversation(cluster.url, cluster.model, args.max_tokens, {"X-SMG-Routing-Key": f"bench-{uuid.uuid4().hex[:10]}"}, args.system)
             for _ in range(args.named)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(lambda c: [c.turn(f"Named turn {t} of {c.http.headers['X-SMG-Routing-Key']}.", whole) for t in range(3)], named))
    named_homes = Counter(c.turns[0][0] for c in named)
    for c in (*headerless, *named):
        c.http.close()
    return {
        "memory": sum(prompt < MEMORY_SHARE * full for prompt, full in later), "later": len(later),
        "prompt": statistics.median(p for p, _ in later), "whole": statistics.median(f for _, f in later),
        "per_node": per_node, "worst": max(per_node) / statistics.mean(per_node),
        "named": sum(len({node for node, _, _ in c.turns}) == 1 for c in named), "named_of": len(named),
        "named_per_node": [named_homes.get(url, 0) for url in cluster.workers],
        "rate": len(headerless) * args.turns / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--named", type=int, default=9, help="routing-key conversations of 3 turns each")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--system", help="a system prompt every conversation opens with (as apps that share one)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"configurations to measure (default: all): {', '.join(CONFIGURATIONS)}")
    parser.add_argument("--model-path", type=Path, default=BUNDLED_MODEL)
    args = parser.parse_args()
    from memt_core.client.chat_format import load_chat_format, load_tokenizer

    chat_format = load_chat_format(args.model_path, tokenizer=load_tokenizer(args.model_path))[0]
    configurations = {name: flags for name, flags in CONFIGURATIONS.items() if not args.only or any(o in name for o in args.only)}
    work = Path(tempfile.mkdtemp(prefix="memt-bench-routing-"))
    say(f"model {args.model_path.name}; {args.pairs} pairs; {args.conversations} header-less conversations x {args.turns} turns, "
        f"{args.named} named x 3, {args.concurrency} at a time{'; a shared system prompt' if args.system else ''}; logs under {work}")
    say(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} before the run (the pairs share these cores)")
    cluster = Cluster(args.pairs, args.model_path, work / "cluster", 10.0, routing=next(iter(configurations.values())))
    results = {}
    try:
        for name, flags in configurations.items():
            cluster.route(flags)
            results[name] = figures = measure(cluster, args, lambda sent: len(chat_format.conversation_ids(sent)))
            say(f"  {name}: {figures['memory']}/{figures['later']} later turns from memory, conversations per node {figures['per_node']}")
    finally:
        cluster.close()
    say()
    say(f"{'configuration':36} {'turns 3+ from memory':>22} {'prompt (whole)':>15} {'conversations/node':>20} {'max/mean':>9} "
        f"{'named on 1 node':>16} {'named/node':>11} {'turns/s':>8}")
    for name, f in results.items():
        say(f"{name:36} {f['memory']:>6}/{f['later']:<4} ({f['memory'] / f['later']:5.0%}) {f['prompt']:>6.0f} ({f['whole']:>4.0f}) "
            f"{'/'.join(map(str, f['per_node'])):>20} {f['worst']:>8.2f}x {f['named']:>9}/{f['named_of']:<6} "
            f"{'/'.join(map(str, f['named_per_node'])):>11} {f['rate']:>8.2f}")
    for name, flags in configurations.items():
        say(f"  {name}: smg launch {' '.join(flags)}")
    say("targets: >= 95 % of turns 3+ from memory; named sessions 100 % on one node; no node over 1.5x the mean of conversations")


if __name__ == "__main__":
    main()
