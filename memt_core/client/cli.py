"""``python -m memt_core.client``: chat with a MemT server from a terminal.

The tokenizer and prompt format come from a local copy of the checkpoint the server serves
(``--tokenizer``); ``--model`` names its family and must agree with it. Each line you type is one
chat turn; lines starting with ``/`` are commands (``/help`` lists them). ``MEMT_API_KEY`` is sent
as ``Authorization: Bearer`` when set.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Callable, TextIO

from memt_core import families
from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.client.errors import MemTClientError
from memt_core.client.native import NativeClient
from memt_core.client.session import MemTSession
from memt_core.sampling_params import DEFAULT_MAX_NEW_TOKENS

DEFAULT_URL = "http://127.0.0.1:30000"
#: Tool rounds the CLI answers itself (it has no tools) before leaving a turn pending.
MAX_TOOL_ROUNDS = 3
NO_TOOLS_RESULT = "error: no tools are available in this interactive client"

COMMANDS = {
    "/read on|off": "turn reading the session's memory on or off",
    "/commit": "commit the unsaved turns to memory (they leave the prompt)",
    "/save [name.safetensors]": "commit unsaved turns and save memory as a server-side snapshot (new ID if no name)",
    "/load ID": "replace memory with a snapshot from the server's state directory (clears the conversation)",
    "/ingest PATH": "write a local text file into memory, in chunk_tokens pieces (shows progress)",
    "/status": "show the session's state: memory reading, unsaved turns, transaction receipts, uncertainty",
    "/recover": "reconcile an operation whose outcome is uncertain, from the server's commit receipts",
    "/reset": "clear the session's memory and the conversation",
    "/help": "show this help",
    "/quit": "close the session (memory is not saved) and exit; Ctrl-D does the same",
}


def build_parser() -> argparse.ArgumentParser:
    command_help = "\n".join(f"  {name:<26} {text}" for name, text in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="python -m memt_core.client",
        description=(
            "Interactive chat with a MemT server (memt-http-v1). Every line is one chat turn; "
            "lines starting with / are commands."
        ),
        epilog=f"commands:\n{command_help}\n\nenvironment:\n  MEMT_API_KEY               sent as 'Authorization: Bearer <key>' when set",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tokenizer", required=True, metavar="PATH",
                        help="local checkpoint directory of the served model (tokenizer, chat template or encoding_dsv4.py, config.json)")
    parser.add_argument("--model", required=True, choices=families.names(),
                        help="model family; must match the checkpoint at --tokenizer and the server's model")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"server address (default: {DEFAULT_URL})")
    parser.add_argument("--enable-memory", action="store_true",
                        help="after each completed answer, commit the unsaved past turns and the current one to memory")
    encoder_families = ", ".join(f.name for f in map(families.get, families.names()) if f.takes_encoder)
    parser.add_argument("--deepseek-encoder", metavar="PATH", default=None,
                        help=f"{encoder_families} only: the encoding_dsv4.py to execute for prompts (default: the one in --tokenizer)")
    parser.add_argument("--system", metavar="PROMPT", default=None, help="system prompt for the conversation")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                        help=f"most tokens generated per reply (default: {DEFAULT_MAX_NEW_TOKENS}); longer replies are truncated and not auto-committed")
    parser.add_argument("--thinking", choices=("on", "off"), default=None,
                        help="reasoning before answering (default: the chat format's own default)")
    parser.add_argument("--session", metavar="ID", default=None, help="session ID to create (default: the server picks one)")
    parser.add_argument("--timeout", type=float, default=300, metavar="SECONDS", help="HTTP timeout per request (default: 300)")
    return parser


def describe_error(exc: MemTClientError) -> str:
    """A user-facing explanation of a client error, with what to do next."""
    lines = [f"error: {exc}"]
    if exc.uncertain:
        where = f" (stage {exc.stage}" + (f", transaction {exc.transaction}" if exc.transaction else "") + ")" if exc.stage else ""
        lines.append(
            f"the outcome is uncertain{where}: the server may or may not have applied it. "
            "Run /status to inspect the server's receipts, then /recover before writing again."
        )
    answer = exc.answer
    if isinstance(answer, dict) and answer.get("answer") is not None:
        lines.append(f"(the reply completed before the failure: {answer['answer']})")
    return "\n".join(lines)


class Repl:
    """The interactive loop; ``read`` returns a line or raises EOFError, ``out`` receives the output."""

    def __init__(self, session: MemTSession, args: argparse.Namespace, *, out: TextIO = sys.stdout,
                 read: Callable[[str], str] = input):
        self.session = session
        self.args = args
        self.out = out
        self.read = read
        self.thinking = None if args.thinking is None else args.thinking == "on"

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def run(self) -> int:
        self.say("Type a message to chat, /help for commands, /quit to leave.")
        while True:
            try:
                line = self.read("you> ")
            except EOFError:
                self.say()
                break
            except KeyboardInterrupt:
                self.say()
                continue
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if self.command(line) == "quit":
                        break
                else:
                    self.chat(line)
            except MemTClientError as exc:
                self.say(describe_error(exc))
            except KeyboardInterrupt:
                self.say("\n(interrupted)")
        return self.close()

    def close(self) -> int:
        try:
            self.session.close()
        except MemTClientError as exc:
            self.say(describe_error(exc))
            self.say(f"session {self.session.session_id} was not closed")
            return 1
        self.say("bye")
        return 0

    # ------------------------------------------------------------------ chat

    def chat(self, message: str) -> None:
        result = self.session.chat(
            message, enable_memory=self.args.enable_memory, enable_thinking=self.thinking,
            return_dict=True, max_new_tokens=self.args.max_new_tokens,
        )
        rounds = 0
        while result["requires_action"] and rounds < MAX_TOOL_ROUNDS:
            self.show(result)
            self.say("(this client has no tools: answering each call with an error)")
            results = [{"tool_call_id": call["id"], "content": NO_TOOLS_RESULT} for call in result["tool_calls"]]
            result = self.session.submit_tool_results(results)
            rounds += 1
        self.show(result)
        if result["requires_action"]:
            self.say("(the model keeps calling tools; the turn stays pending — /reset to drop it)")

    def show(self, result: dict) -> None:
        if result.get("reasoning"):
            self.say(f"[thinking] {result['reasoning']}")
        self.say(f"memt> {result['answer']}")
        for call in result.get("tool_calls") or []:
            self.say(f"[tool call] {call['function']['name']}({call['function']['arguments']})")
        if not result["generation_completed"]:
            self.say(f"(truncated at {self.args.max_new_tokens} tokens: kept in the conversation, not committed automatically)")
        if result.get("memory_updated"):
            self.say(f"[memory] committed turns {_numbers(result['committed_turns'])}")

    # ------------------------------------------------------------------ commands

    def command(self, line: str) -> str | None:
        try:
            parts = shlex.split(line)
        except ValueError as exc:
            self.say(f"cannot parse the command: {exc}")
            return None
        name, rest = parts[0].lower(), parts[1:]
        session = self.session
        if name in ("/quit", "/exit"):
            return "quit"
        if name == "/help":
            for command, text in COMMANDS.items():
                self.say(f"  {command:<26} {text}")
        elif name == "/read":
            if len(rest) != 1 or rest[0].lower() not in ("on", "off"):
                self.say("usage: /read on|off")
                return None
            session.set_memory_read(rest[0].lower() == "on")
            self.say(f"memory reading {'on' if session.memory_read else 'off'}")
        elif name == "/commit":
            result = session.commit_history()
            if result["committed_turns"]:
                self.say(f"committed turns {_numbers(result['committed_turns'])}")
            else:
                self.say("nothing to commit")
        elif name == "/save":
            if len(rest) > 1:
                self.say("usage: /save [name.safetensors]")
                return None
            snapshot = session.save_state(rest[0] if rest else None)
            committed = f" (committed turns {_numbers(snapshot['committed_turns'])})" if snapshot["committed_turns"] else ""
            self.say(f"saved {snapshot['path']}{committed}")
        elif name == "/load":
            if len(rest) != 1:
                self.say("usage: /load ID")
                return None
            session.load_state(rest[0])
            self.say(f"loaded {rest[0]}: memory replaced, conversation cleared, memory reading on")
        elif name == "/ingest":
            if len(rest) != 1:
                self.say("usage: /ingest PATH")
                return None
            self.ingest(Path(rest[0]).expanduser())
        elif name == "/status":
            self.status()
        elif name == "/recover":
            result = session.recover()
            if not result.get("recovered"):
                self.say(f"nothing to recover ({result.get('reason', 'no uncertain operation')})")
            else:
                self.say(
                    f"recovered transaction {result['transaction']}: {result['state']}; "
                    f"{result['landed_commits']} commit(s) had landed, {result['resent_commits']} sent now"
                )
        elif name == "/reset":
            session.reset()
            self.say("memory and conversation cleared")
        else:
            self.say(f"unknown command {name}; /help lists the commands")
        return None

    def ingest(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.say(f"cannot read {path}: {exc}")
            return
        from tqdm import tqdm

        bar = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, unit="chunk", desc=f"ingesting {path.name}", file=sys.stderr, dynamic_ncols=True)
            bar.update(done - bar.n)

        try:
            result = self.session.ingest(text, progress=progress)
        finally:
            if bar is not None:
                bar.close()
        self.say(f"ingested {path.name}: {result['tokens']} tokens in {result['chunks']} chunk(s)")

    def status(self) -> None:
        status = self.session.status()
        self.say(f"session: {status.get('session')}")
        self.say(f"memory reading: {'on' if self.session.memory_read else 'off'}")
        self.say(f"uncommitted turns: {status['uncommitted_turns']}")
        self.say(f"pending tool calls: {status['pending_tool_calls']}")
        self.say(f"published version: {status.get('published_version')}")
        self.say(f"open transaction: {status.get('transaction') or 'none'}")
        if status["uncertain"]:
            self.say(f"UNCERTAIN: stage {status.get('uncertain_stage')}, transaction {status.get('uncertain_transaction')}; run /recover")
            receipt = (status.get("receipts") or {}).get(status.get("uncertain_transaction") or "")
            if receipt:
                states = ", ".join(c["status"] for c in receipt["commits"]) or "no commits"
                self.say(f"receipt {receipt['transaction']}: {receipt['state']} ({states})")
        else:
            self.say("uncertain: no")


def _numbers(values) -> str:
    return ", ".join(str(v) for v in values)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_new_tokens < 1:
        print("error: --max-new-tokens must be at least 1", file=sys.stderr)
        return 2
    path = Path(args.tokenizer).expanduser()
    try:
        from memt_core.checkpoint import read_checkpoint

        family = read_checkpoint(path, validate_backbone=False).family
    except Exception as exc:  # noqa: BLE001 — any unreadable checkpoint is a usage error here
        print(f"error: cannot read the checkpoint at {path}: {exc}", file=sys.stderr)
        return 2
    if family.name != args.model:
        print(f"error: --model {args.model} does not match the checkpoint at {path}, which is {family.name}", file=sys.stderr)
        return 2
    if args.deepseek_encoder and not family.takes_encoder:
        print(f"error: --deepseek-encoder does not apply to {family.name} checkpoints (their prompts use no encoder script)", file=sys.stderr)
        return 2

    _quiet_transformers()
    try:
        tokenizer = load_tokenizer(path)
        chat_format, parser = load_chat_format(path, tokenizer=tokenizer, deepseek_encoder=args.deepseek_encoder)
    except Exception as exc:  # noqa: BLE001
        print(f"error: cannot load the tokenizer or prompt format from {path}: {exc}", file=sys.stderr)
        return 2
    try:
        import readline  # noqa: F401 — line editing and history for input()
    except ImportError:
        pass

    client = NativeClient(args.url, api_key=os.environ.get("MEMT_API_KEY") or None, timeout=args.timeout)
    try:
        capabilities = client.capabilities()
        served = capabilities.get("model")
        if served and served != args.model:
            print(f"error: the server at {args.url} serves {served}, not {args.model}", file=sys.stderr)
            return 2
        session = MemTSession(client, chat_format, parser, session=args.session, system_prompt=args.system)
    except MemTClientError as exc:
        print(describe_error(exc), file=sys.stderr)
        if getattr(exc, "status", None) == 401:
            print("set MEMT_API_KEY to the server's API key", file=sys.stderr)
        return 1
    memory = "on" if args.enable_memory else "off"
    print(f"connected to {args.url} ({args.model}); session {session.session_id}; "
          f"memory reading on; automatic memory writes {memory}", flush=True)
    try:
        return Repl(session, args).run()
    finally:
        client.close()


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass
