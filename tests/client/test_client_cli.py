"""The interactive CLI (``python -m memt_core.client``) driven through a pseudo-terminal, and the
three examples, against live servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from client.scripted import ANSWERS, PLAIN_FIRST
from client.support import API_KEY, Live

from memt_core.client import MemTClientError
from memt_core.client.cli import build_parser, describe_error

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
PROMPT = "you> "


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("MEMT_API_KEY", None)
    env.update(TERM="dumb", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _cli_args(live: Live, *extra: str) -> list[str]:
    return ["-m", "memt_core.client", "--tokenizer", str(live.checkpoint), "--model", live.family,
            "--url", live.server.url, "--thinking", "off", *extra]


def _spawn(live: Live, *extra: str, env: dict | None = None) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, _cli_args(live, *extra), cwd=str(REPO), env=env or _env(),
                          encoding="utf-8", timeout=120, dimensions=(40, 200))
    child.expect("connected to ")
    child.expect_exact(PROMPT)
    return child


def _run(child: pexpect.spawn, line: str, *expected: str) -> str:
    child.sendline(line)
    for text in expected:
        child.expect_exact(text)
    child.expect_exact(PROMPT)
    return child.before


def test_cli_session_through_a_pty(live_nano: Live, tmp_path):
    document = tmp_path / "notes.txt"
    document.write_text("The document describes a library of books, a river, and a small town by the sea. " * 4)
    child = _spawn(live_nano, "--max-new-tokens", "32")
    try:
        _run(child, PLAIN_FIRST, f"memt> {ANSWERS['first']}")
        _run(child, "/status", "uncommitted turns: 1", "uncertain: no")
        _run(child, "/commit", "committed turns 1")
        _run(child, "/commit", "nothing to commit")
        _run(child, "/save cli-nano.safetensors", "saved cli-nano.safetensors")
        assert (live_nano.server.state_directory / "cli-nano.safetensors").is_file()
        _run(child, "/read off", "memory reading off")
        _run(child, "/status", "memory reading: off")
        _run(child, "/load cli-nano.safetensors", "loaded cli-nano.safetensors")
        _run(child, "/status", "memory reading: on", "uncommitted turns: 0", "published version: ")
        _run(child, f"/ingest {document}", "ingesting notes.txt", "ingested notes.txt: ")
        _run(child, "/load missing.safetensors", "error: ")  # a server refusal is shown, the loop goes on
        _run(child, "/save ../outside.safetensors", "error: ")
        _run(child, "/read sideways", "usage: /read on|off")
        _run(child, "/frobnicate", "unknown command /frobnicate")
        _run(child, "/help", "/read on|off", "/commit", "/save [name.safetensors]", "/load ID", "/status", "/reset", "/quit")
        _run(child, PLAIN_FIRST, "memt> ")
        _run(child, "/reset", "memory and conversation cleared")
        _run(child, "/status", "uncommitted turns: 0")
        child.sendline("/quit")
        child.expect_exact("bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_cli_enable_memory_and_ctrl_d(live_flash: Live):
    child = _spawn(live_flash, "--enable-memory", "--max-new-tokens", "32")
    try:
        _run(child, PLAIN_FIRST, f"memt> {ANSWERS['first']}", "[memory] committed turns 1")
        _run(child, "/status", "uncommitted turns: 0")
        _run(child, PLAIN_FIRST, "memt> ")  # unscripted now (memory holds turn 1): cut off, not committed
        child.sendeof()
        child.expect_exact("bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_cli_honours_memt_api_key(keyed_server, long_chunk_checkpoint):
    base = [sys.executable, "-m", "memt_core.client", "--tokenizer", str(long_chunk_checkpoint), "--model", "memt-nano",
            "--url", keyed_server.url]
    refused = subprocess.run(base, input="/quit\n", capture_output=True, text=True, cwd=REPO, env=_env(), timeout=120)
    assert refused.returncode == 1
    assert "MEMT_API_KEY" in refused.stderr and "error:" in refused.stderr
    accepted = subprocess.run(base, input="/status\n/quit\n", capture_output=True, text=True, cwd=REPO,
                              env=_env(MEMT_API_KEY=API_KEY), timeout=120)
    assert accepted.returncode == 0, accepted.stderr
    assert "uncommitted turns: 0" in accepted.stdout and "bye" in accepted.stdout


def test_cli_refuses_a_model_that_does_not_match(live_nano: Live, flash_checkpoint):
    wrong_family = subprocess.run(
        [sys.executable, *_cli_args(live_nano)[:4], "--model", "memt-flash", "--url", live_nano.server.url],
        capture_output=True, text=True, cwd=REPO, env=_env(), timeout=120,
    )
    assert wrong_family.returncode == 2
    assert "--model memt-flash does not match the checkpoint" in wrong_family.stderr
    other_server = subprocess.run(
        [sys.executable, "-m", "memt_core.client", "--tokenizer", str(flash_checkpoint), "--model", "memt-flash",
         "--url", live_nano.server.url],
        capture_output=True, text=True, cwd=REPO, env=_env(), timeout=120,
    )
    assert other_server.returncode == 2
    assert "serves memt-nano, not memt-flash" in other_server.stderr


def test_cli_help_explains_every_option():
    text = build_parser().format_help()
    for option in ("--tokenizer", "--model", "--url", "--enable-memory", "--deepseek-encoder", "--system",
                   "--max-new-tokens", "--thinking", "--session", "MEMT_API_KEY"):
        assert option in text
    for command in ("/read on|off", "/commit", "/save [name.safetensors]", "/load ID", "/ingest PATH", "/status",
                    "/recover", "/reset", "/quit"):
        assert command in text
    for action in build_parser()._actions:
        assert action.help, action.dest


def test_cli_error_messages():
    uncertain = MemTClientError("commit: the connection failed", uncertain=True, stage="commit", transaction="t-1")
    text = describe_error(uncertain)
    assert "uncertain" in text and "stage commit" in text and "t-1" in text and "/status" in text and "/recover" in text
    plain = describe_error(MemTClientError("import: no such snapshot", stage="import", status=400))
    assert plain == "error: import: no such snapshot"
    answered = MemTClientError("publish failed", stage="publish", answer={"answer": "Hello"})
    assert "Hello" in describe_error(answered)


# ---------------------------------------------------------------------- examples

EXAMPLES = REPO / "examples"


def _example(name: str, live: Live, *extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), str(live.checkpoint), "--url", live.server.url, "--max-new-tokens", "12", *extra],
        capture_output=True, text=True, cwd=REPO, env=_env(), timeout=180,
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_examples_run_against_a_live_server(live_nano: Live, live_flash: Live):
    out = _example("generate.py", live_nano).stdout
    assert "memory reading off" in out and out.count("assistant:") == 2 and "nothing was written to memory" in out
    out = _example("document_memory.py", live_nano).stdout
    assert "ingested" in out and "assistant:" in out
    out = _example("commit_history.py", live_nano).stdout
    assert "committed turns [1, 2]" in out and "messages in the restored session: 0" in out
    out = _example("generate.py", live_flash).stdout
    assert out.count("assistant:") == 2


def test_repl_answers_tool_calls_it_cannot_run(live_nano: Live):
    """The CLI has no tools: when the model calls one anyway, it answers each call with an error text
    so the turn can finish (here with a session that advertises the scripted tools)."""
    import io

    from client.scripted import TOOL_QUESTION, TOOLS

    from memt_core.client.cli import NO_TOOLS_RESULT, Repl

    client, rec = live_nano.client()
    session = live_nano.session(client, tools=TOOLS)
    lines = iter([TOOL_QUESTION, "/status", "/quit"])
    out = io.StringIO()
    args = build_parser().parse_args(["--tokenizer", str(live_nano.checkpoint), "--model", "memt-nano", "--max-new-tokens", "60"])
    assert Repl(session, args, out=out, read=lambda prompt: next(lines)).run() == 0
    text = out.getvalue()
    assert '[tool call] lookup({"item": "age"})' in text and "this client has no tools" in text
    second_prompt = [r.body["input_ids"] for r in rec.records if r.operation == "query"][1]
    answer = live_nano.chat_format.tool_results_ids([{"tool_call_id": "x", "content": NO_TOOLS_RESULT}], enable_thinking=False)
    assert second_prompt[-len(answer):] == answer  # the error text went back to the model
    assert "pending tool calls: 0" in text or "keeps calling tools" in text
    assert rec.since(0)[-2:] == ["acquire", "close"] and text.rstrip().endswith("bye")
