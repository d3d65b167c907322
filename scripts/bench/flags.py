#!/usr/bin/env python
"""Two deployments that differ only in their core's launcher flags, side by side: which flags answer faster.

    python scripts/bench/flags.py                          # the defaults against --torch-threads <cores>
    python scripts/bench/flags.py --a="--enable-torch-compile" --b="" [--two-process] [--repeats 12]

Starts, on 127.0.0.1, two deployments on the bundled demo model (one-process ``memt_proxy --embedded`` by
default; ``--two-process``: ``memt_core.launch`` + ``memt_proxy --upstream`` each), the first with the core
flags ``--a``, the second with ``--b``, and sends both the same requests with plain httpx, alternating which
goes first, so that a busy machine slows both alike. Every answer is exactly ``--tokens`` tokens long
(``min_tokens`` = ``max_tokens``), so both decode the same amount. Per repetition:

- *memory turn 1*: a new session (``X-MemT-Session``) is told a fact; its commit runs behind the answer;
- *memory turn 2*: the same session asks about it (the app resends turn 1, which memory holds: trimmed);
- *replay*: no session, a transcript of ``--replay-turns`` earlier turns read in full (a long prefill);
- *N at once*: ``--sessions`` new sessions each send turn 1 at the same time (until the last answer).

Prints each case's median latency for A and B, B / A, and the server CPU seconds (user + system, from /proc
on Linux) each deployment spent per case, which shows threads that spin while they wait.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from demo import free_port, start  # noqa: E402  (start a server process, wait for its /health)
from turns import message, server_cpu  # noqa: E402

CASES = ("memory turn 1", "memory turn 2", "replay", "at once")


class Deployment:
    """One deployment's servers and an HTTP client to its proxy."""

    def __init__(self, label: str, core_flags: str, work: Path, *, two_process: bool, model: list[str]):
        self.label = label
        self.processes = []
        quiet = ["--log-level", "warning"]
        port = free_port()
        if two_process:
            core_port = free_port()
            self.processes.append(start(["-m", "memt_core.launch", *model, "--port", str(core_port), *quiet, *shlex.split(core_flags)],
                                        f"http://127.0.0.1:{core_port}", work / f"{label}-core.log", f"core {label}", 900))
            proxy = ["-m", "memt_proxy", "--upstream", f"http://127.0.0.1:{core_port}"]
        else:
            proxy = ["-m", "memt_proxy", *model, "--embedded", f"--core-args={core_flags}"]
        self.url = f"http://127.0.0.1:{port}"
        self.processes.append(start([*proxy, "--port", str(port), *quiet], self.url, work / f"{label}-proxy.log", f"proxy {label}", 900))
        self.pids = tuple(p.pid for p in self.processes)
        self.http = httpx.Client(base_url=self.url, timeout=300)
        self.model = self.http.get("/v1/models").json()["data"][0]["id"]
        self.clear()

    def clear(self) -> None:
        """Forget what was measured (after the warm-up)."""
        self.latency: dict[str, list[float]] = {case: [] for case in CASES}
        self.cpu: dict[str, list[float]] = {case: [] for case in CASES}

    def ask(self, messages: list[dict], tokens: int, session: str | None = None) -> str:
        headers = {"X-MemT-Session": session} if session else {}
        body = {"model": self.model, "messages": messages, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0.0}
        response = self.http.post("/v1/chat/completions", json=body, headers=headers)
        if response.status_code != 200:
            raise SystemExit(f"{self.label}: {response.status_code} {response.text}")
        return response.json()["choices"][0]["message"]["content"]

    def timed(self, case: str, work) -> object:
        cpu, started = server_cpu(self.pids), time.perf_counter()
        result = work()
        self.latency[case].append(time.perf_counter() - started)
        after = server_cpu(self.pids)
        if cpu is not None and after is not None:
            self.cpu[case].append(after - cpu)
        return result

    def stop(self) -> None:
        self.http.close()
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=30)


def repetition(deployment: Deployment, transcript: list[dict], args: argparse.Namespace, pause: float) -> None:
    session = f"bench-{uuid.uuid4().hex[:12]}"
    told = [{"role": "user", "content": "I have a kitten named Belkavo who loves small shrimp."}]
    answer = deployment.timed("memory turn 1", lambda: deployment.ask(told, args.tokens, session))
    time.sleep(pause)  # the user reads the answer; its commit runs meanwhile
    asked = [*told, {"role": "assistant", "content": answer}, {"role": "user", "content": "What is my kitten's name?"}]
    deployment.timed("memory turn 2", lambda: deployment.ask(asked, args.tokens, session))
    deployment.timed("replay", lambda: deployment.ask(transcript, args.tokens))
    with ThreadPoolExecutor(args.sessions) as pool:
        sessions = [f"bench-{uuid.uuid4().hex[:12]}" for _ in range(args.sessions)]
        deployment.timed("at once", lambda: list(pool.map(lambda s: deployment.ask(told, args.tokens, s), sessions)))
    time.sleep(pause)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", default="", help='core flags of deployment A, as one string (with "=": --a="--torch-threads 1"; default: none)')
    parser.add_argument("--b", default=f"--torch-threads {os.cpu_count()}", help="core flags of deployment B (default: --torch-threads <this machine's cores>)")
    parser.add_argument("--two-process", action="store_true", help="core and proxy as two processes (default: one-process, proxy --embedded)")
    parser.add_argument("--repeats", type=int, default=12, help="repetitions of every case (medians taken)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens of every answer")
    parser.add_argument("--sessions", type=int, default=4, help="sessions sending turn 1 at once")
    parser.add_argument("--replay-turns", type=int, default=30, help="earlier turns in the replayed transcript")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between turns (the user reading)")
    parser.add_argument("--model-path", default=None, help="checkpoint (default: the bundled demo model)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.tokens < 1 or args.sessions < 1 or args.replay_turns < 0:
        parser.error("--repeats, --tokens and --sessions must be at least 1, --replay-turns at least 0")

    transcript = []
    for turn in range(1, args.replay_turns + 1):
        transcript += [{"role": "user", "content": message(turn)}, {"role": "assistant", "content": f"Noted: locker {(turn * 37) % 1000:03d}."}]
    transcript.append({"role": "user", "content": "Which code opens locker 037?"})
    model = ["--model-path", args.model_path] if args.model_path else []
    kind = "two-process (core + proxy)" if args.two_process else "one-process (proxy --embedded)"
    deployments: list[Deployment] = []
    with tempfile.TemporaryDirectory(prefix="memt-flags-") as tmp:
        try:
            for label, flags in (("A", args.a), ("B", args.b)):
                print(f"starting {label}, {kind}, core flags: {flags or '(none)'} ...", flush=True)
                deployments.append(Deployment(label, flags, Path(tmp), two_process=args.two_process, model=model))
            for deployment in deployments:  # warm both up (first requests load and allocate)
                repetition(deployment, transcript, args, 0.0)
                deployment.clear()
            for index in range(args.repeats):
                for deployment in deployments if index % 2 == 0 else deployments[::-1]:
                    repetition(deployment, transcript, args, args.pause)
        finally:
            for deployment in deployments:
                deployment.stop()
    a, b = deployments
    print(f"\n{kind}, {args.repeats} repetitions, {args.tokens}-token answers; A: {args.a or '(none)'}; B: {args.b or '(none)'}")
    print(f"{'case':<16}{'A median s':>12}{'B median s':>12}{'B / A':>8}{'A CPU s':>10}{'B CPU s':>10}")
    for case in CASES:
        la, lb = statistics.median(a.latency[case]), statistics.median(b.latency[case])
        ca = f"{statistics.median(a.cpu[case]):10.3f}" if a.cpu[case] else f"{'-':>10}"
        cb = f"{statistics.median(b.cpu[case]):10.3f}" if b.cpu[case] else f"{'-':>10}"
        name = f"{args.sessions} at once" if case == "at once" else case
        print(f"{name:<16}{la:12.3f}{lb:12.3f}{lb / la:8.2f}{ca}{cb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
