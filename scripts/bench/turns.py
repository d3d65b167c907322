#!/usr/bin/env python
"""Memory turns against replay turns through the proxy, per turn, for both deployments, in one run.

    python scripts/bench/turns.py [--turns 100] [--pause 0.5] [--first-turns 10] [--equal-answers] [--model-path DIR]
    python scripts/bench/turns.py --core-args="--enable-torch-compile"   # both cores with a compiled decode step

Starts, on 127.0.0.1, the two-process deployment (``memt_core.launch`` + ``memt_proxy --upstream``) and
the one-process one (``memt_proxy --embedded``), both on the bundled demo model, and holds in each two
conversations of the same unchanged OpenAI SDK app, which resends its whole history every turn (greedy
answers of at most ``--max-tokens`` tokens): *memory* (``X-MemT-Session``: the proxy trims what memory
holds and commits each turn behind its answer) and *replay* (no session: the model reads the whole
transcript every turn). The four conversations advance turn by turn, interleaved, so that all four see
the same machine load; the app waits ``--pause`` seconds after each answer (a user reading it; the
turn's commit runs meanwhile; ``--pause 0`` makes each memory turn wait for the previous commit).
Latency is request to complete response, measured by the client (the openai SDK, or with
``--raw-http`` plain httpx, which leaves out the SDK's own request building). Each request's *client
building* time is measured too: from the call to the moment its HTTP request leaves the client (the
SDK transforms and encodes all the messages it is given; httpx only encodes them), so the ratios can
be read with and without the client's own share. The two modes' answers differ in length where the
model answers differently from memory and from a long transcript; ``--equal-answers`` gives each replay
answer exactly the length of the memory answer of its turn, so both decode the same number of tokens.

Turn 1 is also measured on ``--first-turns`` fresh sessions per deployment (median), since a single
first turn is one noisy sample; ``--conversations K`` holds K such memory and replay conversations per
deployment (all interleaved) and takes each turn's latency as the median over them (K odd, e.g. 3).
Printed: per turn, prompt tokens and latencies of both modes and their ratio, for both deployments,
one-process / two-process, and the memory conversations' client building;
then the upstream requests a memory turn makes (from the two-process core's /metrics), the issue's
targets, met or not, and the memory turn N / turn 2 ratios without the client building, and between
turns shaped like turn 2 (prompt and answer of about its length: the demo model's answers that run
into ``--max-tokens`` are not committed, so they come back as context and the next prompts grow).
Turn 100 and turn 2 of a conversation are minutes apart, and the machine's load drifts over minutes (both
deployments' memory turns, interleaved, rise and fall together by 20-30 %), so the issue's turn N / turn 2 target is
checked side by side: ``--pairs`` rounds of a further turn of a long memory conversation, each followed by turn 2 of a
fresh one; the ratios of turns measured minutes apart are printed beside it, not counted.
Last, the servers' CPU time per turn (from /proc, Linux), which the machine's load changes less than latency:
what each deployment spends on a memory or replay turn, and behind a memory answer (its commit).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
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

def server_cpu(pids: tuple[int, ...]) -> float | None:
    """CPU seconds (user + system) the processes ``pids`` have used so far; None where /proc cannot tell (not Linux).

    It changes less with the machine's load than latency does, so it helps compare deployments on a busy machine.
    """
    total = 0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def message(turn: int) -> str:
    """The app's user message of ``turn`` (1-based): a new fact each turn, the same number of tokens every turn."""
    return f"Note {turn:03d}: the code of locker {(turn * 37) % 1000:03d} is K{(turn * 53) % 1000:03d}."


class Conversation:
    """One app conversation through one proxy: with memory (a session) or replaying its history."""

    def __init__(self, base_url: str, model: str, *, memory: bool, max_tokens: int, raw: bool = False, servers: tuple[int, ...] = ()):
        from openai import DefaultHttpxClient, OpenAI

        hooks = {"request": [self._sending]}  # called as the built request leaves the client
        self.client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300, http_client=DefaultHttpxClient(event_hooks=hooks))
        self.raw = httpx.Client(base_url=base_url, timeout=300, event_hooks=hooks) if raw else None  # plain HTTP instead of the SDK
        self.model, self.max_tokens = model, max_tokens
        self.headers = {"X-MemT-Session": f"bench-{uuid.uuid4().hex[:12]}"} if memory else {}
        self.history: list[dict] = []
        self.latency: list[float | None] = []
        self.prompt: list[int | None] = []
        self.answer: list[int | None] = []  # completion tokens
        self.building: list[float | None] = []  # client building: seconds from the call to the request leaving the client
        self.servers = servers  # the deployment's server processes, whose CPU time each turn is measured on
        self.cpu: list[float | None] = []  # server CPU seconds from the request to the complete response
        self.behind: list[float | None] = []  # server CPU seconds after the response, until :meth:`rested` (the commit behind it)
        self._answered_cpu: float | None = None
        self.ended = False  # refused (e.g. past the context limit): no further turns
        self._sent: float | None = None

    def _sending(self, request: httpx.Request) -> None:
        self._sent = time.perf_counter()

    def turn(self, text: str, answer_tokens: int | None = None) -> None:
        """One turn; ``answer_tokens``: an answer of exactly that many tokens (``min_tokens`` = ``max_tokens``)."""
        import openai

        if self.ended:
            self._missing()
            return
        self.history.append({"role": "user", "content": text})
        limits = {"max_tokens": answer_tokens or self.max_tokens}
        extra = {"min_tokens": answer_tokens} if answer_tokens else {}
        cpu_before = server_cpu(self.servers)
        started = self._sent = time.perf_counter()
        try:
            if self.raw is not None:
                response = self.raw.post("/v1/chat/completions", headers=self.headers, json={
                    "model": self.model, "messages": self.history, **limits, **extra, "temperature": 0.0})
                if response.status_code == 400:
                    raise openai.BadRequestError(response.text, response=response, body=None)
                reply = openai.types.chat.ChatCompletion.model_validate(response.raise_for_status().json())
            else:
                reply = self.client.chat.completions.create(
                    model=self.model, messages=self.history, **limits, temperature=0.0, extra_headers=self.headers, extra_body=extra or None,
                )
        except openai.BadRequestError as exc:
            self.ended = True
            self._missing()
            print(f"   ({'memory' if self.headers else 'replay'} refused at turn {len(self.latency)}: {exc.message[:90]})", flush=True)
            return
        self.latency.append(time.perf_counter() - started)
        self._answered_cpu = server_cpu(self.servers)
        self.cpu.append(_minus(self._answered_cpu, cpu_before))
        self.building.append(self._sent - started)
        self.prompt.append(reply.usage.prompt_tokens)
        self.answer.append(reply.usage.completion_tokens)
        self.history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})

    def rested(self) -> None:
        """The app's pause after the answer is over: the server CPU used since the response is the turn's work behind it."""
        self.behind.append(_minus(server_cpu(self.servers), self._answered_cpu))
        self._answered_cpu = None

    def _missing(self) -> None:
        """No measurement this turn (refused, or ended earlier)."""
        self._answered_cpu = None
        for values in (self.latency, self.prompt, self.answer, self.building, self.cpu):
            values.append(None)

    def served(self) -> list[float | None]:
        """Latency without the client building: what the proxy, the core and the connection take."""
        return [None if lat is None else lat - build for lat, build in zip(self.latency, self.building)]


class Medians:
    """Several like conversations seen as one: at each turn the median of their figures (latency, CPU) and the
    lower median of their token counts; a single conversation is itself."""

    def __init__(self, conversations: list[Conversation]):
        for name in ("latency", "building", "cpu", "behind"):
            setattr(self, name, [median(list(values)) for values in zip(*(getattr(c, name) for c in conversations))])
        for name in ("prompt", "answer"):
            setattr(self, name, [median(list(values), statistics.median_low) for values in zip(*(getattr(c, name) for c in conversations))])
        self._served = [median(list(values)) for values in zip(*(c.served() for c in conversations))]

    def served(self) -> list[float | None]:
        return self._served


def first_turns(deployments: dict[str, tuple[str, tuple[int, ...]]], model: str, count: int, max_tokens: int, pause: float,
                raw: bool = False, equal: bool = False) -> dict[str, dict[str, list[float | None]]]:
    """Turn 1 of ``count`` fresh conversations per deployment (label → (url, server pids)): label → {"memory", "replay",
    "memory cpu", "replay cpu"} → latencies and server CPU seconds.

    The deployments take turns session by session, so that all see the same machine load (and the same
    background work of the others, such as idle leases being released); ``equal``: see ``--equal-answers``.
    """
    found: dict[str, dict[str, list[float | None]]] = {label: {"memory": [], "replay": [], "memory cpu": [], "replay cpu": []} for label in deployments}
    for index in range(count):
        for label, (base_url, servers) in deployments.items():
            answer = None
            for mode in ("memory", "replay"):
                conversation = Conversation(base_url, model, memory=mode == "memory", max_tokens=max_tokens, raw=raw, servers=servers)
                conversation.turn(message(index + 1), answer if equal and mode == "replay" else None)
                answer = conversation.answer[0]
                found[label][mode].append(conversation.latency[0])
                found[label][f"{mode} cpu"].append(conversation.cpu[0])
                time.sleep(pause)
    return found


def side_by_side(long: dict[str, Conversation], deployments: dict[str, tuple[str, tuple[int, ...]]], model: str, pairs: int,
                 max_tokens: int, pause: float, raw: bool = False, equal: bool = False) -> dict[str, tuple[list, list]]:
    """Late turns against turn 2, seconds apart: ``pairs`` rounds, the deployments taking turns, each a further turn of
    the deployment's ``long`` memory conversation, then a fresh memory conversation's turn 1 (not measured) and turn 2,
    with the same message (``equal``: an answer as long as the late turn's). label → (late latencies, turn-2 latencies).

    Turn 100 and turn 2 of one conversation are minutes apart, and the machine's load drifts over minutes: both
    deployments' memory turns, interleaved, rise and fall together by 20-30 % over a run."""
    found: dict[str, tuple[list, list]] = {label: ([], []) for label in deployments}
    for _ in range(pairs):
        for label, (base_url, servers) in deployments.items():
            talk = long[label]
            turn = len(talk.latency) + 1
            talk.turn(message(turn))
            time.sleep(pause)
            talk.rested()
            fresh = Conversation(base_url, model, memory=True, max_tokens=max_tokens, raw=raw, servers=servers)
            for text, answer in ((message(turn - 1), None), (message(turn), talk.answer[-1] if equal else None)):
                fresh.turn(text, answer)
                time.sleep(pause)
                fresh.rested()
            found[label][0].append(talk.latency[-1])
            found[label][1].append(fresh.latency[-1])
    return found


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


def ms(value: float | None, width: int = 6, digits: int = 0) -> str:
    return f"{value * 1000:{width}.{digits}f}" if value is not None else " " * (width - 1) + "—"


def tokens(value: int | None) -> str:
    return f"{value:5d}" if value is not None else "    —"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=100, help="turns per conversation")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds the app waits after each answer (the user reading it)")
    parser.add_argument("--first-turns", type=int, default=10, help="fresh sessions on which turn 1 is measured again (median)")
    parser.add_argument("--conversations", type=int, default=1, help="memory and replay conversations per deployment, interleaved; "
                        "each turn's figures are the medians over them (odd numbers: 3 makes the single-turn ratios far less noisy)")
    parser.add_argument("--pairs", type=int, default=30, help="rounds of the side-by-side measurement of a late memory turn against turn 2 "
                        "(0: none; then turn N / turn 2 is checked on turns measured minutes apart)")
    parser.add_argument("--max-tokens", type=int, default=24, help="longest answer, in tokens")
    parser.add_argument("--model-path", default=None, help="checkpoint (default: the bundled demo model)")
    parser.add_argument("--raw-http", action="store_true", help="send the app's requests with plain httpx instead of the openai SDK (whose request building grows with the transcript)")
    parser.add_argument("--equal-answers", action="store_true", help="make each replay answer exactly as long as the memory answer of the same turn "
                        "(min_tokens = max_tokens), so that both modes decode the same number of tokens")
    parser.add_argument("--core-args", default="", help="more flags of python -m memt_core.launch for both deployments' cores, as one string "
                        "(e.g. --core-args=\"--enable-torch-compile\": with \"=\", as a value that starts with a dash)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="memt-bench-turns-"))
    model = ["--model-path", args.model_path] if args.model_path else []
    if args.conversations < 1 or args.pairs < 0:
        parser.error("--conversations must be at least 1, --pairs at least 0")
    sessions = 2 * args.first_turns + 2 * args.conversations + args.pairs + 8
    core_flags = ["--max-sessions-per-rank", str(sessions), *shlex.split(args.core_args)]
    wait = 900.0 if "--enable-torch-compile" in core_flags else 180.0  # a core compiles before it reports healthy
    core_port, two_port, one_port = free_port(), free_port(), free_port()
    core_url, two_url, one_url = (f"http://127.0.0.1:{p}" for p in (core_port, two_port, one_port))
    quiet = ["--log-level", "warning"]
    processes = []
    try:
        print("starting the two-process deployment (core + proxy) and the one-process one (proxy --embedded) ...", flush=True)
        processes.append(start(["-m", "memt_core.launch", *model, "--port", str(core_port), *core_flags, *quiet], core_url, work / "core.log", "the core", wait))
        processes.append(start(["-m", "memt_proxy", *model, "--upstream", core_url, "--port", str(two_port), *quiet], two_url, work / "proxy.log", "the proxy"))
        processes.append(start(["-m", "memt_proxy", *model, "--embedded", "--core-args", shlex.join(core_flags), "--port", str(one_port), *quiet],
                               one_url, work / "embedded.log", "the embedded proxy", wait))
        name = httpx.get(two_url + "/v1/models").json()["data"][0]["id"]

        pids = [process.pid for process in processes]
        deployments = {"two-process": (two_url, (pids[0], pids[1])), "one-process": (one_url, (pids[2],))}
        first_turns(deployments, name, 1, args.max_tokens, 0.0, args.raw_http, args.equal_answers)  # warm-up: lazily initialised code paths
        print(f"turn 1 on {args.first_turns} fresh sessions per deployment, the deployments taking turns ...", flush=True)
        first = first_turns(deployments, name, args.first_turns, args.max_tokens, args.pause, args.raw_http, args.equal_answers)

        print(f"{args.turns} turns, {4 * args.conversations} conversations interleaved ...", flush=True)
        held = {(label, mode, k): Conversation(url, name, memory=mode == "memory", max_tokens=args.max_tokens, raw=args.raw_http, servers=servers)
                for k in range(args.conversations) for label, (url, servers) in deployments.items() for mode in ("memory", "replay")}
        before = upstream_requests(core_url)
        for turn in range(1, args.turns + 1):
            for (label, mode, k), conversation in held.items():  # each deployment's memory turn before its replay turn
                answer = held[(label, "memory", k)].answer[-1] if args.equal_answers and mode == "replay" else None
                conversation.turn(message(turn), answer)
                time.sleep(args.pause)
                conversation.rested()
        after = upstream_requests(core_url)
        talks = {(label, mode): Medians([c for (l, m, _), c in held.items() if (l, m) == (label, mode)])
                 for label in deployments for mode in ("memory", "replay")}
        if args.pairs:
            print(f"{args.pairs} rounds side by side: a further turn of a long memory conversation, then turn 2 of a fresh one ...", flush=True)
        paired = side_by_side({label: held[(label, "memory", 0)] for label in deployments}, deployments, name, args.pairs, args.max_tokens,
                              args.pause, args.raw_http, args.equal_answers)
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
    client = "plain httpx" if args.raw_http else "the openai SDK"
    if args.equal_answers:
        print("replay answers made exactly as long as the memory answers of the same turn (--equal-answers)")
    if args.conversations > 1:
        print(f"each figure: the median over {args.conversations} like conversations (--conversations)")
    print(f"prompt / answer: tokens; ms: request to complete response, as the app sees it; build: the memory conversation's client building (ms, {client})")
    print("       |               two-process: memory vs replay                 |               one-process: memory vs replay                 | 1p/2p")
    print(" turn  | prompt mem  rep | answer mem rep |  ms mem    rep | mem/rep | build | prompt mem  rep | answer mem rep |  ms mem    rep | mem/rep | build | memory")
    for i in range(args.turns):
        print(f" {i + 1:4d}  |      {tokens(two_mem.prompt[i])} {tokens(two_rep.prompt[i])} |    {tokens(two_mem.answer[i])}{tokens(two_rep.answer[i])} | {ms(two_mem.latency[i])} {ms(two_rep.latency[i])} |   {ratio(two_mem.latency[i], two_rep.latency[i])} | {ms(two_mem.building[i], 5, 1)} |"
              f"      {tokens(one_mem.prompt[i])} {tokens(one_rep.prompt[i])} |    {tokens(one_mem.answer[i])}{tokens(one_rep.answer[i])} | {ms(one_mem.latency[i])} {ms(one_rep.latency[i])} |   {ratio(one_mem.latency[i], one_rep.latency[i])} | {ms(one_mem.building[i], 5, 1)} | {ratio(one_mem.latency[i], two_mem.latency[i])}")

    print()
    print(f"upstream requests of a two-process memory conversation, per turn ({args.turns} turns; replay turns, and a new session's "
          "first turn, made while the session is created and leased, are plain generations):")
    for action in sorted(set(after) | set(before)):
        delta = after.get(action, 0) - before.get(action, 0)
        if delta and action != "generate":  # "generate": replay turns' and new sessions' first turns' plain generations
            print(f"   {action:10s} {delta / args.turns / args.conversations:5.2f}" + ("   (before the answer)" if action == "query" else ""))

    print()
    print("targets (issue 18):")
    checks = []

    def check(label: str, value: float | None, limit: float, *, at_most: bool = True, counted: bool = True) -> None:
        met = value is not None and (value <= limit if at_most else value >= limit)
        if counted:
            checks.append(met)
        shown = f"{value:.2f}" if value is not None else "—"
        verdict = ("met    " if met else "NOT met") if counted else ("(met)  " if met else "(over) ")
        print(f"   {verdict}  {label}: {shown} (target ≤ {limit}{'' if counted else '; not counted: measured minutes apart'})")

    own = "this conversation" if args.conversations == 1 else f"medians of {args.conversations} conversations"
    for label, (mem, rep) in ((k, (talks[(k, "memory")], talks[(k, "replay")])) for k in deployments):
        f_mem, f_rep = median(first[label]["memory"]), median(first[label]["replay"])
        check(f"{label}: memory / replay latency at turn 1 (median of {args.first_turns} fresh sessions)", f_mem / f_rep, 1.1)
        check(f"{label}: memory / replay latency at turn 1 ({own})", _div(mem.latency[0], rep.latency[0]), 1.1)
        if args.turns >= 50:
            check(f"{label}: memory / replay latency at turn 50", _div(mem.latency[49], rep.latency[49]), 0.5)
            check(f"{label}: memory / replay latency, medians of turns 48-52", _div(median(mem.latency[47:52]), median(rep.latency[47:52])), 0.5)
        if args.pairs:
            late, second = paired[label]
            check(f"{label}: memory latency, turns {args.turns + 1}-{args.turns + args.pairs} / turn 2 of fresh sessions, side by side "
                  f"(medians of {args.pairs} alternating pairs)", _div(median(late), median(second)), 1.1)
        if args.turns >= 6:
            check(f"{label}: memory latency turn {args.turns} / turn 2", _div(mem.latency[-1], mem.latency[1]), 1.1, counted=not args.pairs)
            check(f"{label}: memory latency, median of the last 5 turns / of turns 2-6", _div(median(mem.latency[-5:]), median(mem.latency[1:6])), 1.1,
                  counted=not args.pairs)
        flat = mem.prompt[-1] - mem.prompt[1] if len(mem.prompt) > 1 and None not in (mem.prompt[-1], mem.prompt[1]) else None
        check(f"{label}: memory prompt tokens, turn {args.turns} − turn 2", flat, 5)
    check("one-process / two-process memory latency at turn 1 (medians of fresh sessions)", _div(median(first["one-process"]["memory"]), median(first["two-process"]["memory"])), 0.9)
    check(f"one-process / two-process memory latency at turn 1 ({own})", _div(one_mem.latency[0], two_mem.latency[0]), 0.9)
    print(f"\n{sum(checks)} of {len(checks)} met; logs in {work}")
    if args.turns >= 6:
        print()
        print(f"what the memory turn {args.turns} / turn 2 ratios are made of (client building: {client}, from the call to the request leaving the client):")
        for label in deployments:
            building(label, talks[(label, "memory")], args.turns)
            if args.pairs:
                late, second = paired[label]
                slower = sum(a > b for a, b in zip(late, second) if a is not None and b is not None)
                print(f"   {label}: side by side, turns {args.turns + 1}-{args.turns + args.pairs} median {ms(median(late), 1, 1)} ms, "
                      f"turn 2 of fresh sessions {ms(median(second), 1, 1)} ms; the late turn the slower in {slower} of {args.pairs} rounds")
    server_work(first, talks, deployments, args.turns)
    return 0


def server_work(first: dict, talks: dict, deployments: dict, turns: int) -> None:
    """Server CPU per turn (means: /proc counts in 10 ms ticks), which a loaded machine changes less than latency: turn 1 of
    the fresh sessions, early and late turns of the long conversations, and the memory turns' work behind the answer."""
    if all(value is None for value in talks[("two-process", "memory")].cpu):
        return
    early, late = min(21, turns), max(1, turns - 20)
    print()
    print("server CPU per turn, ms (means; core + proxy for two-process, the one process for one-process; "
          "less changed by the machine's load than latency, not unchanged: threads waiting for a core spin):")
    for label in deployments:
        mem, rep = talks[(label, "memory")], talks[(label, "replay")]
        print(f"   {label}: turn 1 of fresh sessions memory {ms(mean(first[label]['memory cpu']), 1)} replay {ms(mean(first[label]['replay cpu']), 1)}; "
              f"memory turns 2-{early} {ms(mean(mem.cpu[1:early]), 1)}, turns {late + 1}-{turns} {ms(mean(mem.cpu[late:]), 1)} "
              f"(+ behind the answer {ms(mean(mem.behind[1:early]), 1)} / {ms(mean(mem.behind[late:]), 1)}); "
              f"replay turns 2-{early} {ms(mean(rep.cpu[1:early]), 1)}, turns {late + 1}-{turns} {ms(mean(rep.cpu[late:]), 1)}")
    one, two = first["one-process"]["memory cpu"], first["two-process"]["memory cpu"]
    print(f"   one-process / two-process, memory turn 1 of fresh sessions: {_shown(_div(mean(one), mean(two)))}; "
          f"memory turns 2-{early}: {_shown(_div(mean(talks[('one-process', 'memory')].cpu[1:early]), mean(talks[('two-process', 'memory')].cpu[1:early])))}")


def building(label: str, mem: Medians, turns: int) -> None:
    """The memory conversation's client building at turn 2 and turn ``turns`` (single turns and medians of five)
    and its latency ratios without it."""
    early, late = mem.building[1:6], mem.building[-5:]
    print(f"   {label}: client building turn 2 {ms(mem.building[1], 1, 1)} ms, turn {turns} {ms(mem.building[-1], 1, 1)} ms "
          f"(medians of turns 2-6 {ms(median(early), 1, 1)} ms, last 5 {ms(median(late), 1, 1)} ms)")
    served = mem.served()
    print(f"   {label}: without it, memory latency turn {turns} / turn 2 {_shown(_div(served[-1], served[1]))}, "
          f"median of the last 5 turns / of turns 2-6 {_shown(_div(median(served[-5:]), median(served[1:6])))} "
          f"(with it: {_shown(_div(mem.latency[-1], mem.latency[1]))}, {_shown(_div(median(mem.latency[-5:]), median(mem.latency[1:6])))})")
    early, late = comparable(mem, range(1, 21)), comparable(mem, range(max(21, turns - 20), turns))  # turns 2-21, the last 20
    if early and late:
        print(f"   {label}: turns shaped like turn 2 (turns {_listed(early)} and {_listed(late)}): median latency late / early "
              f"{_shown(_div(_median_at(mem.latency, late), _median_at(mem.latency, early)))}, "
              f"without the client building {_shown(_div(_median_at(served, late), _median_at(served, early)))}")


def comparable(mem: Medians, turns: range) -> list[int]:
    """Indices of the ``turns`` shaped like turn 2: its prompt within 5 tokens and its answer within 2, so that
    neither a longer answer nor uncommitted earlier turns resent as context (an answer cut at ``--max-tokens``
    is not committed) make the turn slower."""
    if len(mem.prompt) < 2 or mem.prompt[1] is None:
        return []
    prompt, answer = mem.prompt[1], mem.answer[1]
    return [i for i in turns if i < len(mem.prompt) and mem.prompt[i] is not None and mem.latency[i] is not None
            and abs(mem.prompt[i] - prompt) <= 5 and abs(mem.answer[i] - answer) <= 2]


def _median_at(values: list, indices: list[int]) -> float | None:
    return median([values[i] for i in indices])


def _listed(indices: list[int]) -> str:
    """Turn numbers of 0-based ``indices``, runs shortened: ``2-6,11``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0] + 1}-{r[-1] + 1}" if len(r) > 1 else f"{r[0] + 1}" for r in runs)


def _shown(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "—"


def mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def median(values: list, of=statistics.median) -> float | None:
    """``of`` (the median, or e.g. ``statistics.median_low`` for counts) of the known values; None if none is."""
    known = [v for v in values if v is not None]
    return of(known) if known else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


if __name__ == "__main__":
    sys.exit(main())
