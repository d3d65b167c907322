#!/usr/bin/env python
"""Header-less memory against a header and against replay, side by side in one run (issue 37).

Starts the one-process proxy (``--embedded``) on the bundled demo model (or ``--model-path``) and plays one
conversation three ways, turn by turn in rotating order: an app that sends ``X-MemT-Session``, the same app
without any header (header-less memory), and the app with ``X-MemT-Memory: off`` (the model reads the whole
transcript: replay). Every app resends its whole history. Prints prompt tokens and latency per turn for
each, then at turn ``--edit-at`` the cost of a regenerate (the same request again, with and without the header) and of an
edit of the first user message (the rest kept), each against replaying that same transcript, as ratios measured back
to back. Each app opens with a name of its own: the same transcript would read the states another app's turns kept.

    PYTHONPATH=. python scripts/bench/headerless.py                  # 30 turns, bundled demo model, CPU
    PYTHONPATH=. python scripts/bench/headerless.py --turns 60 --model-path CHECKPOINT --core-args "--device cuda"
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from demo import free_port, start  # noqa: E402  (the demo's: start a server process, wait for its /health)

MODES = {"header": {"X-MemT-Session": "bench-headed"}, "no header": {}, "replay": {"X-MemT-Memory": "off"}}


#: each app's own opening: an app with a header keeps the state before each turn, which the same transcript without a
#: header (the same tenant) would read
NAMES = {"header": "Ottilie", "no header": "Odalys", "replay": "Ottavia"}


def message(turn: int, mode: str) -> str:
    return f"Hi, my name is {NAMES[mode]} and I live in Samarkand." if turn == 1 else f"Tell me something, number {turn}."


def timed(client, model: str, messages: list[dict], headers: dict, max_tokens: int) -> tuple[float, int, str]:
    began = time.perf_counter()
    response = client.chat.completions.create(model=model, messages=messages, temperature=0.0, max_tokens=max_tokens, extra_headers=headers)
    return time.perf_counter() - began, response.usage.prompt_tokens, response.choices[0].message.content or ""


def edits(client, model, history: list[dict], headed: list[dict], args) -> dict[str, list]:
    """At --edit-at, right after the answer: a regenerate of it (without a header, and of the app's with one) and an
    edit of the first message, each against replaying the same transcript (memory off), measured back to back
    (``timed``'s figures per try)."""
    names = ["Radomir", "Wojciech", "Thandiwe", "Oluwaseun", "Beatrix", "Cosima", "Leopold", "Svetlana"]
    costs = {"regenerate": [], "regenerate with a header": [], "replay of it": [], "edit": [], "replay of the edit": []}
    for repeat in range(args.repeats):
        costs["regenerate"].append(timed(client, model, history, {}, args.max_tokens))
        costs["regenerate with a header"].append(timed(client, model, headed, MODES["header"], args.max_tokens))
        costs["replay of it"].append(timed(client, model, history, MODES["replay"], args.max_tokens))
        # each edit a new one: a repeated edit would resume from the state the first one left
        variant = [{"role": "user", "content": f"Hi, my name is {names[repeat % len(names)]} and I live in Bukhara."}, *history[1:]]
        costs["edit"].append(timed(client, model, variant, {}, args.max_tokens))
        costs["replay of the edit"].append(timed(client, model, variant, MODES["replay"], args.max_tokens))
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-path", default=str(ROOT / "memt_core/bundled/memt-tiny-demo"), help="checkpoint to serve")
    parser.add_argument("--core-args", default="--device cpu --max-sessions-per-rank 64", help="flags of the embedded core")
    parser.add_argument("--turns", type=int, default=30, help="turns of the conversation")
    parser.add_argument("--edit-at", type=int, default=10, help="the turn at which a regenerate and an edit are measured")
    parser.add_argument("--repeats", type=int, default=3, help="regenerate / edit / replay measurements at --edit-at (medians)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max tokens per answer")
    parser.add_argument("--plot", default=None, metavar="SVG", help="also draw prompt tokens and latency per turn into this SVG (the bench extra: matplotlib)")
    args = parser.parse_args(argv)

    from openai import OpenAI

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkstemp(prefix="bench-headerless-", suffix=".log")[1])
    proxy = start(["-m", "memt_proxy", "--embedded", "--port", str(port), "--model-path", args.model_path, "--core-args", args.core_args,
                   "--log-level", "warning"], url, log, "proxy")
    try:
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        histories = {mode: [] for mode in MODES}
        rows = []
        for turn in range(1, args.turns + 1):
            row = {}
            order = list(MODES)[turn % 3:] + list(MODES)[: turn % 3]
            for mode in order:
                history = histories[mode]
                history.append({"role": "user", "content": message(turn, mode)})
                seconds, prompt, answer = timed(client, model, history, MODES[mode], args.max_tokens)
                history.append({"role": "assistant", "content": answer})
                row[mode] = (prompt, seconds)
            rows.append(row)
            if turn == args.edit_at:  # the no-header app regenerates this answer, then edits its first message
                costs = edits(client, model, histories["no header"][:-1], histories["header"][:-1], args)
        print(f"model {model}, {args.turns} turns, greedy, max {args.max_tokens} tokens per answer; every app resends its whole history")
        print("turn  " + "".join(f"{mode:>22}" for mode in MODES) + "   (prompt tokens, latency ms)")
        for turn, row in enumerate(rows, start=1):
            print(f"{turn:>4}  " + "".join(f"{row[mode][0]:>10} {row[mode][1] * 1000:>9.0f}  " for mode in MODES))
        last, second = rows[-1], rows[1]
        for mode in MODES:
            print(f"{mode:>10}: turn {args.turns} prompt {last[mode][0]} tokens, turn 2 {second[mode][0]}")
        if args.plot:
            from bench.plot import per_turn  # scripts/ is on the path

            drawn = per_turn(args.plot, {mode: [(p, s * 1000) for p, s in (row[mode] for row in rows)] for mode in MODES},
                             [(0, "prompt tokens"), (1, "latency (ms)")], title=f"one conversation three ways, {model}",
                             note=f"python scripts/bench/headerless.py --turns {args.turns} --plot …; {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
            print(f"plot: {drawn}")
        apart = max(abs(row["no header"][0] - row["header"][0]) for row in rows[2:])
        print(f"target, no header: from turn 3 on within 6 tokens of the header's prompt: {'met' if apart <= 6 else 'not met'} (at most {apart} apart)")
        late = range(max(2, args.turns - 9), args.turns)
        for mode in ("header", "no header"):
            ratio = statistics.median(rows[t][mode][1] for t in late) / statistics.median(rows[t]["replay"][1] for t in late)
            print(f"{mode} / replay, median latency of turns {late.start + 1}-{args.turns}: {ratio:.2f}")

        median = {name: (statistics.median(c[1] for c in values), statistics.median(c[0] for c in values)) for name, values in costs.items()}
        print(f"at turn {args.edit_at} (medians of {args.repeats}): " + ", ".join(f"{name} {p:.0f} tokens {s * 1000:.0f} ms" for name, (p, s) in median.items()))
        print(f"regenerate / replay: prompt {median['regenerate'][0] / median['replay of it'][0]:.2f}, latency {median['regenerate'][1] / median['replay of it'][1]:.2f}")
        met = median["regenerate"][0] <= rows[args.edit_at - 1]["header"][0] + 6
        print(f"target, no header: a regenerate reads <= the header's prompt + 6: {'met' if met else 'not met'}")
        print(f"edit / replay: prompt {median['edit'][0] / median['replay of the edit'][0]:.2f}, latency {median['edit'][1] / median['replay of the edit'][1]:.2f}")
    finally:
        proxy.terminate()
        proxy.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
