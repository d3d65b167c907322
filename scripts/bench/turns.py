#!/usr/bin/env python
"""Memory turns against replay turns through the proxy, per turn, for both deployments, in one run.

    python scripts/bench/turns.py [--turns 100] [--pause 0.5] [--first-turns 10] [--model-path DIR]

Starts, on 127.0.0.1, the two-process deployment (``memt_core.launch`` + ``memt_proxy --upstream``) and
the one-process one (``memt_proxy --embedded``), both on the bundled demo model, and holds in each two
conversations of the same unchanged OpenAI SDK app, which resends its whole history every turn (greedy
answers of at most ``--max-tokens`` tokens): *memory* (``X-MemT-Session``: the proxy trims what memory
holds and commits each turn behind its answer) and *replay* (no session: the model reads the whole
transcript every turn). The four conversations advance turn by turn, interleaved, so that all four see
the same machine load; the app waits ``--pause`` seconds after each answer (a user reading it; the
turn's commit runs meanwhile; ``--pause 0`` makes each memory turn wait for the previous commit).
Latency is request to complete response, measured by the client (the openai SDK, or with
``--raw-http`` plain httpx, which leaves out the SDK's own request building).

Turn 1 is also measured on ``--first-turns`` fresh sessions per deployment (median), since a single
first turn is one noisy sample. Printed: per turn, prompt tokens and latencies of both modes and their
ratio, for both deployments, and one-process / two-process; then the upstream requests a memory turn
makes (from the two-process core's /metrics), and the issue's targets, met or not.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from demo import free_port, start  # noqa: E402  (the demo's: start a server process, wait for its /health)

def message(turn: int) -> str:
    """The app's user message of ``turn`` (1-based): a new fact each turn, the same number of tokens every turn."""
    return f"Note {turn:03d}: the code of locker {(turn * 37) % 1000:03d} is K{(turn * 53) % 1000:03d}."


class Conversation:
    """One app conversation through one proxy: with memory (a session) or replaying its history."""

    def __init__(self, base_url: str, model: str, *, memory: bool, max_tokens: int, raw: bool = False):
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        self.raw = httpx.Client(base_url=base_url, timeout=300) if raw else None  # plain HTTP instead of the SDK
        self.model, self.max_tokens = model, max_tokens
        self.headers = {"X-MemT-Session": f"bench-{uuid.uuid4().hex[:12]}"} if memory else {}
        self.history: list[dict] = []
        self.latency: list[float | None] = []
        self.prompt: list[int | None] = []
        self.answer: list[int | None] = []  # completion tokens
        self.ended = False  # refused (e.g. past the context limit): no further turns

    def turn(self, text: str) -> None:
        import openai

        if self.ended:
            self.latency.append(None)
            self.prompt.append(None)
            self.answer.append(None)
            return
        self.history.append({"role": "user", "content": text})
        started = time.perf_counter()
        try:
            if self.raw is not None:
                response = self.raw.post("/v1/chat/completions", headers=self.headers, json={
                    "model": self.model, "messages": self.history, "max_tokens": self.max_tokens, "temperature": 0.0})
                if response.status_code == 400:
                    raise openai.BadRequestError(response.text, response=response, body=None)
                reply = openai.types.chat.ChatCompletion.model_validate(response.raise_for_status().json())
            else:
                reply = self.client.chat.completions.create(
                    model=self.model, messages=self.history, max_tokens=self.max_tokens, temperature=0.0, extra_headers=self.headers,
                )
        except openai.BadRequestError as exc:
            self.ended = True
            self.latency.append(None)
            self.prompt.append(None)
            self.answer.append(None)
            print(f"   ({'memory' if self.headers else 'replay'} refused at turn {len(self.latency)}: {exc.message[:90]})", flush=True)
            return
        self.latency.append(time.perf_counter() - started)
        self.prompt.append(reply.usage.prompt_tokens)
        self.answer.append(reply.usage.completion_tokens)
        self.history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


def first_turns(base_url: str, model: str, count: int, max_tokens: int, pause: float, raw: bool = False) -> tuple[float, float]:
    """Median latency of turn 1 over ``count`` fresh conversations: (memory, replay)."""
    memory, replay = [], []
    for index in range(count):
        for mode, out in ((True, memory), (False, replay)):
            conversation = Conversation(base_url, model, memory=mode, max_tokens=max_tokens, raw=raw)
            conversation.turn(message(index + 1))
            out.append(conversation.latency[0])
            time.sleep(pause)
    return statistics.median(memory), statistics.median(replay)


def upstream_requests(core_url: str) -> dict[str, float]:
    """The core's request counters: control actions and generation kinds (successful ones)."""
    text = httpx.get(core_url + "/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for name, label in (("memt_control_requests_total", "action"), ("memt_generate_requests_total", "kind")):
        for found in re.finditer(rf'^{name}\{{{label}="([^"]+)",status="(\d+)"\}} (\S+)$', text, re.M):
            if found.group(2).startswith("2"):
                counts[found.group(1)] = counts.get(found.group(1), 0.0) + float(found.group(3))
    return counts


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:5.2f}" if a is not None and b else "    —"


def ms(value: float | None) -> str:
    return f"{value * 1000:6.0f}" if value is not None else "     —"


def tokens(value: int | None) -> str:
    return f"{value:5d}" if value is not None else "    —"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100, help="turns per conversation")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds the app waits after each answer (the user reading it)")
    parser.add_argument("--first-turns", type=int, default=10, help="fresh sessions on which turn 1 is measured again (median)")
    parser.add_argument("--max-tokens", type=int, default=24, help="longest answer, in tokens")
    parser.add_argument("--model-path", default=None, help="checkpoint (default: the bundled demo model)")
    parser.add_argument("--raw-http", action="store_true", help="send the app's requests with plain httpx instead of the openai SDK (whose request building grows with the transcript)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="memt-bench-turns-"))
    model = ["--model-path", args.model_path] if args.model_path else []
    core_flags = ["--max-sessions-per-rank", str(2 * args.first_turns + 8)]
    core_port, two_port, one_port = free_port(), free_port(), free_port()
    core_url, two_url, one_url = (f"http://127.0.0.1:{p}" for p in (core_port, two_port, one_port))
    quiet = ["--log-level", "warning"]
    processes = []
    try:
        print("starting the two-process deployment (core + proxy) and the one-process one (proxy --embedded) ...", flush=True)
        processes.append(start(["-m", "memt_core.launch", *model, "--port", str(core_port), *core_flags, *quiet], core_url, work / "core.log", "the core"))
        processes.append(start(["-m", "memt_proxy", *model, "--upstream", core_url, "--port", str(two_port), *quiet], two_url, work / "proxy.log", "the proxy"))
        processes.append(start(["-m", "memt_proxy", *model, "--embedded", "--core-args", " ".join(core_flags), "--port", str(one_port), *quiet],
                               one_url, work / "embedded.log", "the embedded proxy"))
        name = httpx.get(two_url + "/v1/models").json()["data"][0]["id"]

        deployments = {"two-process": two_url, "one-process": one_url}
        for url in deployments.values():  # warm-up: first requests load lazily initialised code paths
            first_turns(url, name, 1, args.max_tokens, 0.0, args.raw_http)
        print(f"turn 1 on {args.first_turns} fresh sessions per deployment ...", flush=True)
        first = {label: first_turns(url, name, args.first_turns, args.max_tokens, args.pause, args.raw_http) for label, url in deployments.items()}

        print(f"{args.turns} turns, four conversations interleaved ...", flush=True)
        talks = {(label, mode): Conversation(url, name, memory=mode == "memory", max_tokens=args.max_tokens, raw=args.raw_http)
                 for label, url in deployments.items() for mode in ("memory", "replay")}
        before = upstream_requests(core_url)
        for turn in range(1, args.turns + 1):
            for conversation in talks.values():
                conversation.turn(message(turn))
                time.sleep(args.pause)
        after = upstream_requests(core_url)
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()

    two_mem, two_rep, one_mem, one_rep = (talks[key] for key in (("two-process", "memory"), ("two-process", "replay"), ("one-process", "memory"), ("one-process", "replay")))
    print()
    print("prompt / answer: tokens; ms: request to complete response, as the app sees it")
    print("       |           two-process: memory vs replay             |           one-process: memory vs replay             | 1p/2p")
    print(" turn  | prompt mem  rep | answer mem rep |  ms mem    rep | mem/rep | prompt mem  rep | answer mem rep |  ms mem    rep | mem/rep | memory")
    for i in range(args.turns):
        print(f" {i + 1:4d}  |      {tokens(two_mem.prompt[i])} {tokens(two_rep.prompt[i])} |    {tokens(two_mem.answer[i])}{tokens(two_rep.answer[i])} | {ms(two_mem.latency[i])} {ms(two_rep.latency[i])} |   {ratio(two_mem.latency[i], two_rep.latency[i])} |"
              f"      {tokens(one_mem.prompt[i])} {tokens(one_rep.prompt[i])} |    {tokens(one_mem.answer[i])}{tokens(one_rep.answer[i])} | {ms(one_mem.latency[i])} {ms(one_rep.latency[i])} |   {ratio(one_mem.latency[i], one_rep.latency[i])} | {ratio(one_mem.latency[i], two_mem.latency[i])}")

    print()
    print(f"upstream requests of the two-process memory conversation, per turn ({args.turns} turns; replay turns are plain generations):")
    for action in sorted(set(after) | set(before)):
        delta = after.get(action, 0) - before.get(action, 0)
        if delta and action != "generate":  # "generate": the replay conversation's plain generations
            print(f"   {action:10s} {delta / args.turns:5.2f}" + ("   (before the answer)" if action == "query" else ""))

    print()
    print("targets (issue 18):")
    checks = []

    def check(label: str, value: float | None, limit: float, *, at_most: bool = True) -> None:
        met = value is not None and (value <= limit if at_most else value >= limit)
        checks.append(met)
        shown = f"{value:.2f}" if value is not None else "—"
        print(f"   {'met    ' if met else 'NOT met'}  {label}: {shown} (target ≤ {limit})")

    for label, (mem, rep) in ((k, (talks[(k, "memory")], talks[(k, "replay")])) for k in deployments):
        f_mem, f_rep = first[label]
        check(f"{label}: memory / replay latency at turn 1 (median of {args.first_turns} fresh sessions)", f_mem / f_rep, 1.1)
        check(f"{label}: memory / replay latency at turn 1 (this conversation)", _div(mem.latency[0], rep.latency[0]), 1.1)
        if args.turns >= 50:
            check(f"{label}: memory / replay latency at turn 50", _div(mem.latency[49], rep.latency[49]), 0.5)
            check(f"{label}: memory / replay latency, medians of turns 48-52", _div(median(mem.latency[47:52]), median(rep.latency[47:52])), 0.5)
        if args.turns >= 6:
            check(f"{label}: memory latency turn {args.turns} / turn 2", _div(mem.latency[-1], mem.latency[1]), 1.1)
            check(f"{label}: memory latency, median of the last 5 turns / of turns 2-6", _div(median(mem.latency[-5:]), median(mem.latency[1:6])), 1.1)
        flat = mem.prompt[-1] - mem.prompt[1] if len(mem.prompt) > 1 and None not in (mem.prompt[-1], mem.prompt[1]) else None
        check(f"{label}: memory prompt tokens, turn {args.turns} − turn 2", flat, 5)
    check("one-process / two-process memory latency at turn 1 (medians of fresh sessions)", first["one-process"][0] / first["two-process"][0], 0.9)
    check("one-process / two-process memory latency at turn 1 (this conversation)", _div(one_mem.latency[0], two_mem.latency[0]), 0.9)
    print(f"\n{sum(checks)} of {len(checks)} met; logs in {work}")
    return 0


def median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


if __name__ == "__main__":
    sys.exit(main())
