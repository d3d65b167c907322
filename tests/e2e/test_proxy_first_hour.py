"""A new user's first hour with the proxy (issue 58): a busy port, a stop in the README's order, a core stopped first.

Each test starts the real ``python -m memt_proxy`` (and, where it needs one, a real core) on 127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from e2e.servers import HOST, REPO_ROOT


@pytest.mark.parametrize("embedded", [False, True], ids=["two-processes", "embedded"])
def test_a_taken_port_is_refused_in_one_line_before_anything_else(nano_checkpoint, embedded):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        mode = ["--embedded", "--core-args", "--device cpu"] if embedded else ["--upstream", "http://127.0.0.1:9"]
        run = subprocess.run(
            [sys.executable, "-m", "memt_proxy", "--model-path", str(nano_checkpoint), "--host", HOST, "--port", str(port), *mode],
            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        )
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert lines == [f"memt_proxy: refused: cannot listen on {HOST}:{port}: Address already in use"], lines


def test_a_core_stopped_first_costs_one_line_at_the_proxys_shutdown(nano_checkpoint, tmp_path):
    """The README's old stop (``kill %1 %2``: the core first): the proxy, holding the leases of a named session, a
    header-less conversation and a Responses conversation, finds its upstream gone, first renewing them (one line
    each, no traceback), then at shutdown: one line says so, with no traceback (it was a ``release … failed`` with
    three chained tracebacks per held session)."""
    from e2e.proxies import MODEL, ProxyServer
    from e2e.servers import MemTServer

    core = MemTServer(nano_checkpoint, state_directory=tmp_path / "core").start()
    proxy = ProxyServer(core.url, nano_checkpoint, args=["--log-level", "info", "--lease-idle", "600", "--lease-ttl", "3"]).start()
    try:
        client = proxy.openai("unused")
        history = [{"role": "user", "content": "Hi, I live in Lisbon."}]
        for session in ("alice", "bob", None):
            headers = {"X-MemT-Session": session} if session else {}
            for _ in range(2):
                reply = client.chat.completions.create(model=MODEL, messages=history, max_tokens=24, stop=[" ", "e"], extra_headers=headers)
                history = [*history, {"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "And?"}]
        conversation = client.conversations.create().id
        client.responses.create(model=MODEL, conversation=conversation, input="Hello.", max_output_tokens=4)
        for session in ("alice", "bob"):
            proxy.inspect(session, "unused")  # waits for the commits behind their answers
        core.kill()
        deadline = time.monotonic() + 60  # the lease keepers renew every second: each finds the core gone
        while "renewing the lease of" not in proxy.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, proxy.log_tail()
            time.sleep(0.1)
        proxy.stop()
    finally:
        proxy.stop()
        core.close()
    log = proxy.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]  # neither while the core is gone nor at shutdown
    after = log[log.index("Shutting down"):] if "Shutting down" in log else log
    said = [line for line in after.splitlines() if "release" in line or "did not answer" in line]
    assert len(said) == 1 and "session lease(s) not released" in said[0], after[-3000:]


def test_help_states_each_default_once_and_the_states_budget_as_the_docs_do():
    """``python -m memt_proxy --help``: no option says its default twice (it printed "(default: $MEMT_API_KEY) (default:
    None)"), and the header-less states' bound is one number, the same in --help, the code and docs/proxy.md, with the
    count it gives on the demo model (issue 58 item 10)."""
    import re

    from memt_core.bundled import BUNDLED_MODEL
    from memt_core.checkpoint import read_checkpoint
    from memt_proxy.session.state import MEMORY_STATES_BUDGET_MIB, states_within

    text = subprocess.run([sys.executable, "-m", "memt_proxy", "--help"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=True).stdout
    options = re.split(r"\n  (?=-)", " ".join(text.split("\n\n", 1)[1].split(" \n")))
    assert [option.split()[0] for option in options if option.count("(default") > 1] == []
    flat = " ".join(text.split())
    count = states_within(MEMORY_STATES_BUDGET_MIB, read_checkpoint(BUNDLED_MODEL, validate_backbone=False).memory)
    assert f"so {count} states in {MEMORY_STATES_BUDGET_MIB} MiB" in flat and f"(default: {MEMORY_STATES_BUDGET_MIB})" in flat
    docs = " ".join((REPO_ROOT / "docs" / "proxy.md").read_text().split())
    assert f"`--memory-states-budget` ({MEMORY_STATES_BUDGET_MIB} MiB)" in docs and f"so {count:,} states" in docs
