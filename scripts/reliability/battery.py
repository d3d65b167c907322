"""``python -m scripts.reliability.battery``: the reliability battery of issue 13 against live servers.

Starts a tiny-checkpoint core and proxies on 127.0.0.1 and runs, in order: schemathesis against both
OpenAPI documents, the hand-made hostile cases, large chat, Responses and core requests while /health
is timed, the openai SDK's retries reaching a restarted proxy and a Responses conversation, who may drain
a proxy, kill -9 of the core during commit/publish/export, kill -9 of the proxy mid-conversation and in
front of a full core, concurrent sessions with the async openai SDK, two tenants with the same names,
many distinct sessions past the core's capacity, many header-less conversations at once, and the core's and
the proxy's state directories made full or read-only (``disks``); and (``conversations``) a conversation's next
request after its stream was cut, conversations across a core killed -9 and restarted, and whether another
tenant's transcripts change what a request costs.
Prints each check's figures as it ends and a JSON summary last (also written to ``--report``); exits 1
when a check fails. ``--quick`` runs every check small (what CI runs through ``tests/reliability``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from scripts.reliability import checks, conversations
from scripts.reliability.servers import MemTServer, ProxyServer, tiny_checkpoint

KEYS = {"battery-key-one": "one", "battery-key-two": "two"}
ADMIN_KEY = "battery-operator-key"

#: check sizes: (full, quick)
SIZES = {
    "fuzz_examples": (60, 5),
    "fuzz_seconds": (120, 20),
    "kill_core_rounds": (20, 2),
    "kill_proxy_rounds": (3, 1),
    "concurrent": ((64, 20), (8, 3)),
    "tenant_sessions": (8, 2),
    "distinct_sessions": (2000, 90),  # past the core's 64: offloading is exercised either way
    "large_mb": ((1.0, 2.0, 4.0, 5.0), (1.0,)),
    "headerless": ((32, 10), (12, 6)),  # conversations x turns, on a core with two sessions per conversation
}
NAMES = ["fuzz", "hostile", "large", "tiny", "control", "overflow", "strict", "tenants", "concurrent", "retry", "drain", "kill_proxy", "restart", "distinct", "kill_core", "disk", "cut", "core_crash", "headerless"]


def run(*, quick: bool, only: set[str] | None = None, workdir: Path | None = None) -> dict:
    """Every check (or those in ``only``), their figures by name, and ``ok``."""
    size = {name: value[1] if quick else value[0] for name, value in SIZES.items()}
    workdir = Path(workdir or tempfile.mkdtemp(prefix="memt-battery-"))
    checkpoint = tiny_checkpoint(workdir / "checkpoint")
    from memt_core.client.chat_format import load_chat_format, load_tokenizer

    chat_format = load_chat_format(checkpoint, tokenizer=load_tokenizer(checkpoint))[0]
    keys_file = workdir / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    key = next(iter(KEYS))
    results: dict = {}

    def wanted(name: str) -> bool:
        return only is None or name in only

    def record(name: str, started: float, figures: dict) -> None:
        figures["check_seconds"] = round(time.monotonic() - started, 1)
        results[name] = figures
        print(f"[{'ok' if figures['ok'] else 'FAIL'}] {name}: {json.dumps(figures)[:1500]}", flush=True)

    def check(name: str, run_check) -> None:
        """Run one check; a check that raises is recorded as failed with its error, and the battery goes on."""
        started = time.monotonic()
        try:
            figures = run_check()
        except Exception as exc:  # noqa: BLE001 — reported as this check's failure
            figures = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
        record(name, started, figures)

    if wanted("fuzz"):
        # the core is fuzzed on a server of its own: generated requests create sessions under random names
        reports = workdir / "fuzz"
        reports.mkdir(exist_ok=True)
        with MemTServer(checkpoint, state_directory=workdir / "fuzz-state", args=["--max-sessions-per-rank", "64"]) as fuzzed:
            check("fuzz_core", lambda: checks.fuzz("core", fuzzed.url, examples=size["fuzz_examples"], max_time=size["fuzz_seconds"], report_dir=reports))
    # room for the 64 concurrent sessions (sessions in use are never offloaded) and the tenants' besides
    with MemTServer(checkpoint, state_directory=workdir / "core-state", args=["--max-sessions-per-rank", "128"]) as core:
        with ProxyServer(core.url, checkpoint, args=["--api-keys-file", str(keys_file)]) as proxy:
            if wanted("fuzz"):
                check("fuzz_proxy", lambda: checks.fuzz(
                    "proxy", proxy.url, headers={"Authorization": f"Bearer {key}"}, examples=size["fuzz_examples"],
                    max_time=size["fuzz_seconds"], report_dir=workdir / "fuzz",
                ))
            if wanted("hostile"):
                check("hostile", lambda: checks.hostile(proxy, core, key=key))
            if wanted("large"):
                check("large_body", lambda: checks.large_body(proxy, core, sizes=size["large_mb"], key=key))
            if wanted("tiny"):
                check("tiny_messages", lambda: checks.tiny_messages(proxy, key=key))
            if wanted("control"):
                check("control_tokens", lambda: checks.control_tokens(proxy, chat_format, key=key))
            if wanted("tenants"):
                check("two_tenants", lambda: checks.two_tenants(proxy, tuple(KEYS), sessions=size["tenant_sessions"]))
            if wanted("concurrent"):
                sessions, turns = size["concurrent"]
                check("concurrent_sessions", lambda: checks.concurrent_sessions(proxy, sessions=sessions, turns=turns, key=key))
            if wanted("retry"):
                check("responses_retry", lambda: checks.responses_retry(proxy, key=key))
            if wanted("cut"):
                check("cut_streams", lambda: conversations.cut_streams(proxy, core, key=key, tenant=KEYS[key]))
        if wanted("retry"):
            check("restart_retry", lambda: checks.restart_retry(checkpoint, core, state_directory=workdir / "retry-proxy-state"))
        if wanted("kill_proxy"):
            check("kill_proxy", lambda: checks.kill_proxy(checkpoint, core, chat_format, rounds=size["kill_proxy_rounds"]))
        if wanted("drain"):  # last on this core: a proxy of its own, drained
            check("drain_auth", lambda: checks.drain_auth(checkpoint, core, keys_file, tuple(KEYS), admin_key=ADMIN_KEY))
    if wanted("overflow"):
        check("context_overflow", lambda: checks.context_overflow(checkpoint))
    if wanted("strict"):
        check("spec_strict", lambda: checks.spec_strict(checkpoint, state_directory=workdir / "strict-state"))
    if wanted("restart"):
        # three full cores (4 sessions): one with a snapshot store, one without (the proxies share their records), and
        # one with neither store nor state directory (its sessions never committed)
        with MemTServer(checkpoint, state_directory=workdir / "stored-state",
                        args=["--snapshot-store", str(workdir / "store"), "--max-sessions-per-rank", "4"]) as stored, \
                MemTServer(checkpoint, state_directory=workdir / "bare-state", args=["--max-sessions-per-rank", "4"]) as bare, \
                MemTServer(checkpoint, args=["--max-sessions-per-rank", "4"]) as empty:
            check("restart_capacity", lambda: checks.restart_capacity(checkpoint, stored, bare, empty, state_directory=workdir / "capacity-proxy-state"))
    if wanted("distinct"):
        # default proxy settings (no flags at all) in front of a core with the demo model's capacity: 64 sessions
        with MemTServer(checkpoint, state_directory=workdir / "distinct-state", args=["--max-sessions-per-rank", "64"]) as core, \
                ProxyServer(core.url, checkpoint) as plain:
            check("distinct_sessions", lambda: checks.distinct_sessions(plain, core, sessions=size["distinct_sessions"]))
    if wanted("tenants"):  # servers of its own: the core's work per request is compared, nothing else may run there
        with MemTServer(checkpoint, state_directory=workdir / "timing-core-state") as core, \
                ProxyServer(core.url, checkpoint, args=["--api-keys-file", str(keys_file)]) as keyed:
            check("tenant_timing", lambda: conversations.tenant_timing(keyed, core, tuple(KEYS)))
    if wanted("core_crash"):  # a core killed -9 under conversations and restarted without a snapshot store (issue 58)
        with MemTServer(checkpoint, state_directory=workdir / "crash-core-state") as core, ProxyServer(core.url, checkpoint) as plain:
            check("responses_restart", lambda: conversations.responses_restart(plain, core))
            check("crash_behind_answers", lambda: conversations.crash_behind_answers(plain, core))
    if wanted("kill_core"):
        check("kill_core", lambda: checks.kill_core(checkpoint, rounds=size["kill_core_rounds"]))
    if wanted("headerless"):
        conversations_, turns = size["headerless"]
        check("headerless_load", lambda: checks.headerless_load(checkpoint, conversations=conversations_, turns=turns))
    if wanted("disk"):  # state directories made full or read-only under live servers (issue 58)
        check("core_disk", lambda: checks.core_disk(checkpoint, workdir=workdir))
        check("proxy_disk", lambda: checks.proxy_disk(checkpoint, workdir=workdir))
    results["ok"] = all(figures["ok"] for name, figures in results.items() if name != "ok")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.reliability.battery", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every check at a small size (about what CI runs)")
    parser.add_argument("--only", action="append", choices=NAMES, help="run only this check (repeatable)")
    parser.add_argument("--report", default=None, help="also write the JSON summary to this file")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the servers it started are stopped too
    started = time.monotonic()
    results = run(quick=args.quick, only=set(args.only) if args.only else None)
    results["battery_seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(results, indent=2)
    print(text)
    if args.report:
        Path(args.report).write_text(text)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
