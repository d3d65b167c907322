#!/usr/bin/env python
"""Many header-less conversations through one proxy: errors, kept states and the proxy's memory (issue 37).

Starts a core (``--max-sessions-per-rank``) and ``python -m memt_proxy`` in front of it (a tiny random Nano
checkpoint unless ``--model-path``), then runs ``--conversations`` conversations of ``--turns`` turns each
without any header, ``--concurrency`` at a time, every app resending its whole history. Prints the answers by
HTTP status (the target: no 429, no 5xx), the proxy's peak and final RSS, the kept header-less states against
``--max-memory-states``, the states closed to make room, and the memory writes per conversation.

    PYTHONPATH=. python scripts/bench/headerless_load.py                          # 10,000 conversations x 2 turns
    PYTHONPATH=. python scripts/bench/headerless_load.py --conversations 500 --turns 4
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from demo import free_port, start  # noqa: E402  (the demo's: start a server process, wait for its /health)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint to serve (default: a tiny random Nano checkpoint made in a temp dir)")
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=2, help="turns per conversation (1: none is ever kept)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-memory-states", type=int, default=256, help="the proxy's flag")
    parser.add_argument("--max-sessions-per-rank", type=int, default=64, help="the core's flag")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)

    model_path = args.model_path
    if model_path is None:
        model_path = tempfile.mkdtemp(prefix="memt-load-")
        subprocess.run([sys.executable, str(ROOT / "scripts/make_tiny_checkpoint.py"), model_path], check=True, cwd=ROOT)
    core_port, proxy_port = free_port(), free_port()
    core_url, proxy_url = f"http://127.0.0.1:{core_port}", f"http://127.0.0.1:{proxy_port}"
    logs = Path(tempfile.mkdtemp(prefix="memt-load-logs-"))
    core = start(["-m", "memt_core.launch", "--model-path", model_path, "--port", str(core_port), "--device", "cpu",
                  "--max-sessions-per-rank", str(args.max_sessions_per_rank)], core_url, logs / "core.log", "core")
    proxy = start(["-m", "memt_proxy", "--upstream", core_url, "--port", str(proxy_port), "--model-path", model_path,
                   "--max-memory-states", str(args.max_memory_states), "--log-level", "warning"], proxy_url, logs / "proxy.log", "proxy")
    peak, done = [rss_mib(proxy.pid)], threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak.append(rss_mib(proxy.pid))

    statuses: collections.Counter = collections.Counter()
    try:
        threading.Thread(target=sample, daemon=True).start()
        model = httpx.get(proxy_url + "/v1/models").json()["data"][0]["id"]

        async def run() -> None:
            gate = asyncio.Semaphore(args.concurrency)
            async with httpx.AsyncClient(base_url=proxy_url, timeout=300) as http:
                async def conversation(index: int) -> None:
                    async with gate:
                        history: list[dict] = []
                        for turn in range(args.turns):
                            history.append({"role": "user", "content": f"Conversation {index}, turn {turn}."})
                            response = await http.post("/v1/chat/completions", json={
                                "model": model, "messages": history, "max_tokens": args.max_tokens, "temperature": 1.0, "seed": index})
                            statuses[response.status_code] += 1
                            if response.status_code != 200:
                                return
                            history.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"] or ""})

                await asyncio.gather(*(conversation(index) for index in range(args.conversations)))

        began = time.monotonic()
        asyncio.run(run())
        seconds = time.monotonic() - began
        text = httpx.get(proxy_url + "/metrics").text
    finally:
        done.set()
        for process in (proxy, core):
            process.terminate()
            process.wait(30)
    requests = sum(statuses.values())
    print(f"{args.conversations} conversations x {args.turns} turns, {args.concurrency} at a time: {requests} requests in {seconds:.0f} s")
    print("answers by status: " + ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items())))
    bad = sum(count for status, count in statuses.items() if status == 429 or status >= 500)
    print(f"target 0 x 429/5xx: {'met' if bad == 0 else f'not met ({bad})'}")
    print(f"proxy RSS: start {peak[0]:.0f} MiB, peak {max(peak):.0f} MiB, end {peak[-1]:.0f} MiB")
    states = metric(text, "memt_proxy_memory_states")
    print(f"header-less states kept {states:.0f} (--max-memory-states {args.max_memory_states}; core --max-sessions-per-rank {args.max_sessions_per_rank}), "
          f"closed to make room {metric(text, 'memt_proxy_memory_states_closed_total'):.0f}, "
          f"memory writes {metric(text, 'memt_proxy_memory_writes_total'):.0f} ({args.conversations * max(0, args.turns - 1)} expected at most)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
