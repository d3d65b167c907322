#!/usr/bin/env python
"""Does any request pay a compile after the server is ready? Many distinct prompt lengths, each first met after ready.

Starts the native server (``python -m memt_core.launch``, the bundled demo model unless ``--model-path``; extra
launcher flags in ``--core-args``, e.g. ``"--device cuda"``), waits until ``/health`` answers 200 (printing the
warm-up's progress while it answers 503 "warming up"), then, on a session whose memory holds a told text:

1. each of ``--lengths`` (at least 20 distinct lengths, none of them a warm-up bucket by default) once, in a
   shuffled order: a query (the prompt's prefill, reading the memory, and ``--new-tokens`` tokens) and a commit of
   that many tokens — the first time this server process meets the length;
2. then every length ``--repeats`` times more, in a shuffled order each round.

Prints per length the first request's latency, the median of all of its requests, and max / median, for
queries and commits; the target (issue 46): after ready, no request pays a compile: max ≤ 2× median per length.
Runs on the CPU too (where nothing compiles on a first call, and ``--warmup auto`` warms nothing up).

    python scripts/bench/lengths.py
    python scripts/bench/lengths.py --model-path /tmp/nano-widths --core-args "--device cuda" --out lengths.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: 24 lengths between the warm-up buckets (1, 3, 7, 16, 17, 32, 33, … 8192): none of them run before ready
LENGTHS = (2, 5, 11, 23, 41, 50, 77, 99, 130, 181, 250, 333, 420, 600, 777, 1000, 1300, 1700, 2500, 3100, 4000, 5000, 6500, 7800)
TARGET = 2.0


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float) -> float:
    """Seconds until ``/health`` answers 200; prints what a 503 says meanwhile (the warm-up's progress)."""
    started, last = time.monotonic(), None
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with code {process.returncode} before it was ready; its log:\n{log.read_text()[-4000:]}")
        try:
            response = httpx.get(url + "/health", timeout=5)
            if response.status_code == 200:
                return time.monotonic() - started
            said = response.json().get("error", {}).get("message", response.text)
            if said != last:
                print(f"  {time.monotonic() - started:6.1f} s  /health {response.status_code}: {said}", flush=True)
                last = said
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() - started > timeout:
            process.kill()
            raise SystemExit(f"the server was not ready within {timeout:.0f} s (last /health: {last}); its log:\n{log.read_text()[-4000:]}")
        time.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint (default: the bundled demo model)")
    parser.add_argument("--core-args", default="", help='extra launcher flags, e.g. "--device cuda --enable-cuda-graph"')
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt and commit lengths (default: 24 between the warm-up buckets)")
    parser.add_argument("--repeats", type=int, default=3, help="further requests per length after the first (default 3)")
    parser.add_argument("--new-tokens", type=int, default=4, help="tokens each query generates (default 4)")
    parser.add_argument("--ready-timeout", type=float, default=600, help="seconds to wait for /health 200 (default 600)")
    parser.add_argument("--seed", type=int, default=0, help="order and tokens of the requests")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    from memt_core.bundled import BUNDLED_MODEL
    from memt_core.checkpoint import read_checkpoint
    from memt_core.client.native import NativeClient

    model_path = Path(args.model_path or BUNDLED_MODEL)
    checkpoint = read_checkpoint(model_path)
    vocab = int(checkpoint.backbone["vocab_size"])
    context = int(checkpoint.backbone.get("max_position_embeddings") or 32768)
    lengths = sorted({int(part) for part in args.lengths.split(",") if part})
    fitting = [n for n in lengths if n + args.new_tokens + 64 <= context]
    if len(fitting) < len(lengths):
        print(f"lengths beyond the model's context of {context} left out: {sorted(set(lengths) - set(fitting))}")
    lengths = fitting
    rng = random.Random(args.seed)

    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    scratch = Path(tempfile.mkdtemp(prefix="memt-lengths-"))
    log = scratch / "server.log"
    command = [sys.executable, "-m", "memt_core.launch", "--model-path", str(model_path), "--port", str(port),
               "--log-level", "info", "--max-prefill-tokens", str(max(16384, max(lengths) + 64)), *shlex.split(args.core_args)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    print(f"starting: {' '.join(shlex.quote(part) for part in command[1:])}", flush=True)
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    figures: dict = {"lengths": lengths, "query": {}, "commit": {}}
    try:
        ready = wait_ready(url, process, log, args.ready_timeout)
        figures["ready_s"] = ready
        print(f"ready after {ready:.1f} s", flush=True)
        with NativeClient(url, timeout=max(600.0, args.ready_timeout)) as client:
            device = client.capabilities().get("engine", {}).get("device", "?")
            figures["device"] = device
            session = client.control("create", f"lengths-{port}")["session"]
            lease = client.control("acquire", session, ttl=3600)["lease"]
            client.control("begin", session, lease=lease, transaction="told")
            client.commit(session, lease, "told", [rng.randrange(3, vocab) for _ in range(200)])
            client.control("publish", session, lease=lease, transaction="told")
            client.control("begin", session, lease=lease, transaction="bench")

            def timed(kind: str, n: int) -> float:
                ids = [rng.randrange(3, vocab) for _ in range(n)]
                started = time.perf_counter()
                if kind == "query":
                    client.query(session, lease, ids, sampling_params={"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "temperature": 0})
                else:
                    client.commit(session, lease, "bench", ids)
                return time.perf_counter() - started

            times: dict = {kind: {n: [] for n in lengths} for kind in ("query", "commit")}
            for round_ in range(1 + args.repeats):
                order = lengths[:]
                rng.shuffle(order)
                for n in order:
                    for kind in ("query", "commit"):
                        times[kind][n].append(timed(kind, n))
                if round_ == 0:
                    print(f"every length met once ({len(lengths)} lengths, queries and commits)", flush=True)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()

    print(f"\nper length, after ready ({device}; {1 + args.repeats} requests each, the first the length's first): ms")
    header = f"{'tokens':>7}  {'query first':>11}  {'median':>8}  {'max/med':>7}  {'commit first':>12}  {'median':>8}  {'max/med':>7}"
    print(header)
    print("-" * len(header))
    worst = (0.0, None, None)
    first_worst = (0.0, None, None)
    for n in lengths:
        row = [f"{n:>7}"]
        for kind in ("query", "commit"):
            values = times[kind][n]
            median = statistics.median(values)
            ratio = max(values) / median
            figures[kind][n] = {"first_ms": values[0] * 1e3, "median_ms": median * 1e3, "max_ms": max(values) * 1e3, "max_over_median": ratio}
            width = 11 if kind == "query" else 12
            row.append(f"{values[0] * 1e3:>{width},.1f}  {median * 1e3:>8,.1f}  {ratio:>6.2f}×")
            worst = max(worst, (ratio, kind, n))
            first_worst = max(first_worst, (values[0] / median, kind, n))
        print("  ".join(row))
    ratio, kind, n = worst
    met = ratio <= TARGET
    figures["worst"] = {"max_over_median": ratio, "kind": kind, "tokens": n, "target": TARGET, "met": met}
    figures["worst_first"] = {"first_over_median": first_worst[0], "kind": first_worst[1], "tokens": first_worst[2]}
    print(f"\ntarget: after ready, max ≤ {TARGET:g}× median per length: {'met' if met else 'NOT met'} "
          f"(worst {ratio:.2f}×, the {kind} of {n} tokens); ready after {figures['ready_s']:.1f} s")
    print(f"a length's first request / its median: at most {first_worst[0]:.2f}× (the {first_worst[1]} of {first_worst[2]} "
          "tokens): what a compile on the request path would raise")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
