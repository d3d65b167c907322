#!/usr/bin/env python
"""Header-less conversations, a proxy killed mid-load, and the native sessions left on the core (issue 45, item 6).

The target: "after 5,000 conversations and a crash, native sessions on the core <= the documented bound" — the bound
being the core's own ``--max-sessions-per-rank`` (the proxy's ``--memory-states-budget`` holds far more tiny-model states;
``--max-memory-states`` sets a smaller count).

Starts a core (``python -m memt_core.launch``, a tiny random Nano checkpoint unless ``--model-path``) and
``python -m memt_proxy`` in front of it with a ``--state-directory``, then runs ``--conversations`` conversations
without any header (2 or 3 turns each, every app resending its whole history), ``--concurrency`` at a time. Once
``--kill-at`` of them have finished the proxy is killed with SIGKILL (its leases still held on the core, its
in-flight requests cut), restarted on the same port and state directory, and the conversations go on against it (a
request cut by the kill is sent again, as an app would). Every native session on the core is one the proxy made
(no header, so every one is a kept state), so the core's ``memt_sessions`` gauge is the figure, printed:

* while the first proxy ran (the largest value sampled), and right after the kill;
* once the restarted proxy is up but before it adopted anything, and once it adopted its records (``/health/ready``
  runs ``check_upstream``, whose adoption of the recorded kept states (``KeptStates``, session/kept.py) closes recorded states beyond the bound whose lease is free);
* while the rest of the load ran (largest), at the end, and once more after ``--lease-ttl`` passed and a few more
  conversations ran (every lease the killed proxy held has lapsed by then, so every state beyond the bound can be
  closed);

each against the bound, with the native sessions no record in the state directory names (orphans: the core keeps
them, and no proxy will ever close them).

    PYTHONPATH=. python scripts/bench/headerless_crash.py                              # 5,000 conversations
    PYTHONPATH=. python scripts/bench/headerless_crash.py --conversations 500 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
from demo import free_port, start  # noqa: E402  (the demo's: start a server process, wait for its /health)

from memt_proxy.session.state import native_session_id  # noqa: E402


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def core_sessions(core_url: str) -> int:
    """The core's ``memt_sessions`` gauge: the native sessions that exist on it."""
    return int(metric(httpx.get(core_url + "/metrics", timeout=30).text, "memt_sessions"))


def recorded(state: Path) -> tuple[set[str], set[str]]:
    """The native sessions the proxy's records name: (kept states' branch records, per-session records)."""
    sessions = {path.name[: -len(".json")] for path in state.glob("*.json") if not path.name.endswith(".offload.json")}
    branches = set()
    for path in (state / "branches").glob("*.json"):
        try:
            branch = json.loads(path.read_text())
            branches.add(native_session_id(branch["tenant"], branch["name"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return branches, sessions


def existing(core_url: str, natives: set[str]) -> dict[str, dict]:
    """Those of ``natives`` that exist on the core, with their ``inspect`` (which needs no lease)."""
    from memt_core.client.errors import MemTClientError
    from memt_core.client.native import NativeClient

    found = {}
    with NativeClient(core_url, timeout=30) as client:
        for native in sorted(natives):
            try:
                found[native] = client.control("inspect", native)
            except MemTClientError:
                pass
    return found


def census(core_url: str, state: Path) -> tuple[int, int, int]:
    """(native sessions on the core, of them named by a kept state's record, named by no record at all). Every native
    session is the proxy's here (no request has a header)."""
    total = core_sessions(core_url)
    branches, sessions = recorded(state)
    found = existing(core_url, branches | sessions)
    return total, len(found.keys() & branches), max(0, total - len(found))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint to serve (default: a tiny random Nano checkpoint made in a temp dir)")
    parser.add_argument("--conversations", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--kill-at", type=float, default=0.5, help="kill the proxy once this fraction of the conversations finished")
    parser.add_argument("--max-sessions-per-rank", type=int, default=64, help="the core's flag")
    parser.add_argument("--max-memory-states", type=int, default=None, help="the proxy's flag (default: from its --memory-states-budget, so the bound is the core's sessions)")
    parser.add_argument("--lease-ttl", type=int, default=30, help="the proxy's flag: how long the killed proxy's leases outlive it")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--after", type=int, default=64, help="conversations run once the killed proxy's leases lapsed")
    parser.add_argument("--keep", action="store_true", help="keep the servers running at the end until Enter (to look at them)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="memt-crash-"))
    model_path = args.model_path
    if model_path is None:
        model_path = str(work / "checkpoint")
        subprocess.run([sys.executable, str(ROOT / "scripts/make_tiny_checkpoint.py"), model_path], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    state = work / "proxy-state"
    core_port, proxy_port = free_port(), free_port()
    core_url, proxy_url = f"http://127.0.0.1:{core_port}", f"http://127.0.0.1:{proxy_port}"
    core = start(["-m", "memt_core.launch", "--model-path", model_path, "--port", str(core_port), "--device", "cpu",
                  "--max-sessions-per-rank", str(args.max_sessions_per_rank), "--state-directory", str(work / "core-state"), "--log-level", "warning"],
                 core_url, work / "core.log", "core")
    proxy_args = ["-m", "memt_proxy", "--upstream", core_url, "--port", str(proxy_port), "--model-path", model_path, "--state-directory", str(state),
                  "--lease-ttl", str(args.lease_ttl), "--log-level", "warning"]
    if args.max_memory_states is not None:
        proxy_args += ["--max-memory-states", str(args.max_memory_states)]
    lives = [start(proxy_args, proxy_url, work / "proxy-1.log", "proxy")]
    bound = min(args.max_memory_states or args.max_sessions_per_rank, args.max_sessions_per_rank)

    figures: dict[str, object] = {}
    samples: dict[str, list[int]] = {"first proxy": [], "restarted proxy": []}
    phase = ["first proxy"]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            try:
                samples[phase[0]].append(core_sessions(core_url))
            except httpx.HTTPError:
                pass

    statuses: collections.Counter = collections.Counter()
    cut = collections.Counter()  # requests cut by the kill (sent again once the proxy is back)
    prompts: list[int] = []
    try:
        threading.Thread(target=sample, daemon=True).start()
        model = httpx.get(proxy_url + "/v1/models").json()["data"][0]["id"]

        async def load(count: int, first: int, up: asyncio.Event, on_finished=None) -> None:
            gate = asyncio.Semaphore(args.concurrency)
            async with httpx.AsyncClient(base_url=proxy_url, timeout=300, limits=httpx.Limits(max_connections=args.concurrency * 2)) as http:
                async def conversation(index: int) -> None:
                    async with gate:
                        history: list[dict] = []
                        for turn in range(2 + index % 2):
                            history.append({"role": "user", "content": f"Conversation {index}, turn {turn}."})
                            body = {"model": model, "messages": history, "max_tokens": args.max_tokens, "temperature": 1.0, "seed": index}
                            while True:
                                await up.wait()
                                try:
                                    response = await http.post("/v1/chat/completions", json=body)
                                except httpx.TransportError:
                                    cut["transport"] += 1
                                    await asyncio.sleep(0.2)
                                    continue
                                if response.status_code >= 500 and not up.is_set():
                                    cut[response.status_code] += 1
                                    continue
                                break
                            statuses[response.status_code] += 1
                            if response.status_code != 200:
                                return
                            answer = response.json()
                            if turn == 2:
                                prompts.append(answer["usage"]["prompt_tokens"])
                            history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"] or ""})
                    if on_finished is not None:
                        await on_finished()

                await asyncio.gather(*(conversation(first + index) for index in range(count)))

        async def crash_run() -> None:
            up = asyncio.Event()
            up.set()
            finished = [0]
            kill_at = int(args.conversations * args.kill_at)

            async def on_finished() -> None:
                finished[0] += 1
                if finished[0] != kill_at:
                    return
                up.clear()
                lives[0].send_signal(signal.SIGKILL)
                lives[0].wait()
                phase[0] = "restarted proxy"
                figures["killed after"] = finished[0]
                figures["first proxy, largest"] = max(samples["first proxy"], default=0)
                figures["right after the kill"] = await asyncio.to_thread(census, core_url, state)
                lives.append(await asyncio.to_thread(start, proxy_args, proxy_url, work / "proxy-2.log", "proxy"))
                figures["restarted, before adoption"] = await asyncio.to_thread(census, core_url, state)
                ready = await asyncio.to_thread(httpx.get, proxy_url + "/health/ready", timeout=120)
                figures["ready"] = ready.status_code
                figures["restarted, after adoption"] = await asyncio.to_thread(census, core_url, state)
                up.set()

            await load(args.conversations, 0, up, on_finished)

        began = time.monotonic()
        asyncio.run(crash_run())
        seconds = time.monotonic() - began
        figures["restarted proxy, largest"] = max(samples["restarted proxy"], default=0)
        figures["at the end"] = census(core_url, state)
        proxy_metrics = httpx.get(proxy_url + "/metrics").text
        time.sleep(args.lease_ttl + 2)  # every lease of the killed proxy has lapsed now

        async def after() -> None:
            up = asyncio.Event()
            up.set()
            await load(args.after, args.conversations, up)

        asyncio.run(after())
        figures["after the lease ttl and more conversations"] = census(core_url, state)
        if args.keep:
            print(f"servers kept: core {core_url}, proxy {proxy_url}; Enter stops them", flush=True)
            input()
    finally:
        done.set()
        for process in (*lives, core):
            if process.poll() is None:
                process.terminate()
                process.wait(30)

    requests = sum(statuses.values())
    print(f"{args.conversations} header-less conversations of 2-3 turns, {args.concurrency} at a time: {requests} answers in {seconds:.0f} s "
          f"({os.cpu_count()} cores; work directory {work})")
    print("answers by status: " + ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items())))
    print(f"the proxy killed (SIGKILL) after {figures['killed after']} conversations finished; requests cut by it and sent again: "
          + (", ".join(f"{kind}: {count}" for kind, count in sorted(cut.items(), key=str)) or "none"))
    print(f"bound: {bound} native sessions (--max-memory-states {args.max_memory_states or 'from --memory-states-budget'}, core "
          f"--max-sessions-per-rank {args.max_sessions_per_rank})")
    print("native sessions on the core (memt_sessions), and of them named by no proxy record (orphans):")
    for name in ("first proxy, largest", "right after the kill", "restarted, before adoption", "restarted, after adoption",
                 "restarted proxy, largest", "at the end", "after the lease ttl and more conversations"):
        value = figures[name]
        total, branches, orphans = value if isinstance(value, tuple) else (value, None, None)
        print(f"  {name:<45} {total:>4}  {'within' if total <= bound else 'OVER'} the bound"
              + (f"; with a kept state's record {branches}, orphans {orphans}" if orphans is not None else ""))
    print(f"/health/ready of the restarted proxy: {figures['ready']}")
    print(f"restarted proxy: kept states {metric(proxy_metrics, 'memt_proxy_memory_states'):.0f}, "
          f"closed to make room {metric(proxy_metrics, 'memt_proxy_memory_states_closed_total'):.0f}, "
          f"memory writes {metric(proxy_metrics, 'memt_proxy_memory_writes_total'):.0f}")
    if prompts:
        prompts.sort()
        print(f"third-turn prompt tokens: median {prompts[len(prompts) // 2]}, max {prompts[-1]} ({len(prompts)} third turns)")
    final, _, orphans = figures["after the lease ttl and more conversations"]
    met = final <= bound and max(int(figures["restarted proxy, largest"]), figures["at the end"][0]) <= bound
    print(f"target, native sessions on the core <= {bound} after the crash: {'met' if met else 'not met'}"
          f" (at the end {figures['at the end'][0]}, after the lease ttl {final}; largest while loaded after the restart "
          f"{figures['restarted proxy, largest']}; orphans {orphans})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
