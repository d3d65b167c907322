#!/usr/bin/env python
"""Scale-out on this machine: aggregate turns/s with 1, 2, 3 core+proxy pairs behind SMG, and the time to
restore a session on a new node.

    python scripts/bench/cluster.py [--pairs 1 2 3] [--sessions 24] [--turns 4] [--concurrency 8] [--model-path DIR]
                                    [--plot FILE.svg]

For each cluster size, starts on 127.0.0.1 Redis, a fresh shared snapshot store, N pairs
(``memt_core.launch --snapshot-store --ownership`` + ``memt_proxy --cluster --records-directory``) and
SMG (``memt_proxy.http.cluster.SMG_ROUTING``: each session pinned by its ``X-SMG-Routing-Key``), then runs ``--sessions`` conversations of ``--turns``
turns each through SMG with the OpenAI SDK, ``--concurrency`` at a time (greedy answers of at most
``--max-tokens`` tokens; each turn's commit runs behind its answer). Printed: turns/s per size and its
ratio to one pair (expect roughly linear until the machine's cores are saturated: each pair's core is
one process computing on the CPU). ``--plot`` draws turns/s and the ratio against the cluster's size, beside
linear scaling (the ``bench`` extra, matplotlib).

Restore: on a two-pair cluster, a session gets ``--turns`` turns on its node; that node is stopped
(SIGKILL of its core and proxy); once its ownership lease is gone (``--ownership-ttl``), the session's
next turn runs on the other node, which restores its latest published memory from the store. Printed:
that first turn (restore + adopt + turn) against the next turn on the same node (warm), and the
failover time through SMG from the kill to the first answered turn (health check + lease lapse + restore).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
from demo import free_port, start  # noqa: E402  (the demo's: start a server process, wait for its /health)

from memt_demo import BUNDLED_MODEL  # noqa: E402
from memt_proxy.http.cluster import SMG_ROUTING  # noqa: E402
from memt_proxy.session.sessions import native_session_id  # noqa: E402

ROUTED = "x-smg-routed-worker-id"


def say(text: str = "") -> None:
    print(text, flush=True)


#: SMG's routing, as scripts/start_cluster.sh runs it (bench/routing.py measures the choice)
ROUTING = list(SMG_ROUTING)


class Cluster:
    """Redis, N pairs and SMG (``routing``: its policy flags, ``ROUTING`` by default), on a fresh store; ``route``
    restarts SMG with other flags over the same pairs; ``close`` stops them all."""

    def __init__(self, pairs: int, model: Path, work: Path, ttl: float, routing: list[str] | None = None):
        self.processes: list[subprocess.Popen] = []
        self.work = work
        work.mkdir(parents=True)
        redis_port = free_port()
        self.redis = f"redis://127.0.0.1:{redis_port}/0"
        self.processes.append(subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(work)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.nodes: list[tuple[subprocess.Popen, subprocess.Popen, str]] = []

        def pair(i: int) -> tuple[subprocess.Popen, subprocess.Popen, str]:
            core_url, proxy_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
            core = start(["-m", "memt_core.launch", "--model-path", str(model), "--device", "cpu", "--host", "127.0.0.1",
                          "--port", core_url.rsplit(":", 1)[1], "--state-directory", str(work / f"core{i}"),
                          "--snapshot-store", str(work / "store"), "--ownership", self.redis, "--ownership-ttl", str(ttl),
                          "--node-id", f"node{i}", "--max-sessions-per-rank", "256", "--log-level", "warning"],
                         core_url, work / f"core{i}.log", f"core {i}")
            proxy = start(["-m", "memt_proxy", "--model-path", str(model), "--upstream", core_url, "--host", "127.0.0.1",
                           "--port", proxy_url.rsplit(":", 1)[1], "--cluster", "--records-directory", str(work / "records"),
                           "--state-directory", str(work / f"proxy{i}"), "--log-level", "warning"],
                          proxy_url, work / f"proxy{i}.log", f"proxy {i}")
            return core, proxy, proxy_url

        with ThreadPoolExecutor(pairs) as pool:
            self.nodes = list(pool.map(pair, range(pairs)))
        for core, proxy, _ in self.nodes:
            self.processes += [core, proxy]
        self.router: subprocess.Popen | None = None
        self.route(ROUTING if routing is None else routing)

    def route(self, routing: list[str]) -> None:
        """(Re)start SMG over the pairs with the policy flags ``routing``: a fresh router, nothing learnt yet."""
        self.stop_router()
        self.port = free_port()
        smg = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
        log = self.work / "smg.log"
        with log.open("a") as out:
            out.write(f"--- smg {' '.join(routing)}\n")
        self.router = subprocess.Popen(
            [smg, "launch", "--host", "127.0.0.1", "--port", str(self.port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(free_port()), *routing, "--worker-urls", *self.workers,
             "--health-check-endpoint", "/health/ready", "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
             "--disable-retries", "--shutdown-grace-period-secs", "1", "--log-level", "warn"],
            stdout=log.open("a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while self.healthy() != set(self.workers):
            if time.monotonic() > deadline or self.router.poll() is not None:
                raise SystemExit(f"SMG did not register the workers; its log:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        self.model = httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def stop_router(self) -> None:
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()
            try:
                self.router.wait(20)
            except subprocess.TimeoutExpired:
                self.router.kill()
                self.router.wait()
        self.router = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def workers(self) -> list[str]:
        return [url for _, _, url in self.nodes]

    def healthy(self) -> set[str]:
        try:
            return {w["url"] for w in httpx.get(self.url + "/workers", timeout=5).json()["workers"] if w.get("is_healthy")}
        except (httpx.HTTPError, ValueError, KeyError):
            return set()

    def close(self) -> None:
        self.stop_router()
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


class Conversation:
    def __init__(self, url: str, model: str, max_tokens: int, name: str | None = None):
        from openai import OpenAI

        self.name = name or f"bench-{uuid.uuid4().hex[:10]}"
        self.model, self.max_tokens = model, max_tokens
        self.client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300, default_headers={"X-SMG-Routing-Key": self.name})
        self.messages: list[dict] = []

    def turn(self, text: str) -> str:
        """One turn; returns the node that answered."""
        sent = [*self.messages, {"role": "user", "content": text}]
        raw = self.client.chat.completions.with_raw_response.create(model=self.model, messages=sent, max_tokens=self.max_tokens, temperature=0)
        self.messages = [*sent, {"role": "assistant", "content": raw.parse().choices[0].message.content}]
        return raw.headers.get(ROUTED, self.client.base_url.host)


FACTS = ["My name is Ann.", "I live in Oslo.", "My cat is called Tom.", "I work as a baker.", "What is my name?", "Where do I live?"]


def throughput(cluster: Cluster, sessions: int, turns: int, concurrency: int, max_tokens: int) -> tuple[float, int]:
    conversations = [Conversation(cluster.url, cluster.model, max_tokens) for _ in range(sessions)]

    def talk(conversation: Conversation) -> set[str]:
        return {conversation.turn(FACTS[t % len(FACTS)]) for t in range(turns)}

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        nodes = list(pool.map(talk, conversations))
    elapsed = time.perf_counter() - started
    assert all(len(n) == 1 for n in nodes), "a session's turns landed on more than one node"
    return sessions * turns / elapsed, len(set().union(*nodes))


def restore(cluster: Cluster, turns: int, max_tokens: int, repeats: int) -> dict:
    """Per session: kill its node, time the first turn on the other node (direct), then a warm one."""
    import redis

    coordination = redis.Redis.from_url(cluster.redis)
    firsts, warms, failovers = [], [], []
    for _ in range(repeats):
        alive = [(core, proxy, url) for core, proxy, url in cluster.nodes if proxy.poll() is None]
        if len(alive) < 2:
            break
        conversation = Conversation(cluster.url, cluster.model, max_tokens)
        for t in range(turns):
            home = conversation.turn(FACTS[t % len(FACTS)])
        core, proxy, _ = next(n for n in alive if n[2] == home)
        other = next(url for _, _, url in alive if url != home)
        killed = time.perf_counter()
        for process in (proxy, core):
            process.send_signal(signal.SIGKILL)
            process.wait()
        key = f"memt:owner:{native_session_id('default', conversation.name)}"
        while coordination.exists(key):  # the dead node's lease lapses
            time.sleep(0.01)
        direct = Conversation(other, cluster.model, max_tokens, name=conversation.name)
        direct.messages = conversation.messages
        started = time.perf_counter()
        direct.turn("Where do I live?")  # restore from the store, adopt, answer
        answered = time.perf_counter()
        firsts.append(answered - started)
        failovers.append(answered - killed)
        started = time.perf_counter()
        direct.turn("What is my name?")
        warms.append(time.perf_counter() - started)
        conversation.messages = direct.messages
        while home in cluster.healthy():  # SMG's health check drops the dead node
            time.sleep(0.05)
        assert conversation.turn("Thanks.") == other, "through SMG the session should now be on the other node"
    return {"first": firsts, "warm": warms, "failover": failovers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--ownership-ttl", type=float, default=2.0)
    parser.add_argument("--restores", type=int, default=1, help="sessions moved in the restore measurement (each kills a node; needs 2 pairs per move)")
    parser.add_argument("--model-path", type=Path, default=BUNDLED_MODEL)
    parser.add_argument("--plot", type=Path, metavar="FILE.svg", help="also draw turns/s per cluster size as SVG (matplotlib)")
    args = parser.parse_args()
    for binary in ("redis-server",):
        if shutil.which(binary) is None:
            raise SystemExit(f"{binary} is not installed (scripts/setup.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="memt-bench-cluster-"))
    say(f"model {args.model_path.name}; {args.sessions} sessions x {args.turns} turns, {args.concurrency} at a time; logs under {work}")
    say(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} before the run (the pairs share these cores)")
    rates = {}
    for pairs in args.pairs:
        cluster = Cluster(pairs, args.model_path, work / f"pairs{pairs}", args.ownership_ttl)
        try:
            rate, used = throughput(cluster, args.sessions, args.turns, args.concurrency, args.max_tokens)
        finally:
            cluster.close()
        rates[pairs] = rate
        base = rates.get(args.pairs[0])
        say(f"{pairs} pair(s): {rate:6.2f} turns/s  (sessions on {used} node(s); x{rate / base:.2f} of {args.pairs[0]} pair(s))")
    cluster = Cluster(1 + args.restores, args.model_path, work / "restore", args.ownership_ttl)
    try:
        measured = restore(cluster, args.turns, args.max_tokens, args.restores)
    finally:
        cluster.close()
    first_ms, warm_ms = (statistics.median(measured[k]) * 1000 for k in ("first", "warm"))
    say(f"restore on a new node: first turn {first_ms:.0f} ms (restore + adopt + turn) vs warm turn {warm_ms:.0f} ms; "
        f"from SIGKILL to the first turn answered on the new node {statistics.median(measured['failover']):.2f} s (--ownership-ttl {args.ownership_ttl:g})")
    if args.plot is not None:
        from bench.plot import lines  # scripts/ is on the path

        base, first = rates[args.pairs[0]], args.pairs[0]
        sizes = list(rates)
        series = {"measured": [(rates[n], rates[n] / base) for n in sizes],
                  "linear": [(base * n / first, n / first) for n in sizes]}
        note = (f"{os.cpu_count()} CPU cores; {args.sessions} sessions x {args.turns} turns, {args.concurrency} at a time; "
                f"restore: first turn {first_ms:.0f} ms vs warm {warm_ms:.0f} ms")
        drawn = lines(args.plot, sizes, series, [(0, "turns/s"), (1, f"x of {first} pair(s)")], x_label="core+proxy pairs behind SMG",
                      title=f"Cluster scaling on the demo model ({args.model_path.name})", note=note)
        say(f"plot: {drawn}")


if __name__ == "__main__":
    main()
