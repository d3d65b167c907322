"""Every fenced command block of the README, of the documentation site (docs/*.md) and of the adapters'
READMEs runs, as written, on this clone.

Each document is read top to bottom as a new user would, in the project's ``.venv`` (reached only
through the document's own ``. .venv/bin/activate`` line: the test starts from a PATH without it). Its ``bash`` blocks run command by command from the repository
root, its ``python`` blocks as scripts (``python -``), against the servers the document itself starts,
so a README edit is tested as soon as it is made. A block that cannot run here (a GPU, a network install,
Redis and a shared store) is marked in the document itself by an HTML comment on the line before it,
``<!-- not run: REASON -->``, which the reader shows nowhere and this test skips (a marker without a reason
or without a block after it fails); single commands of the README's blocks may instead be listed in
``EXEMPT`` with the reason. An unmarked block that fails, a block without a language tag, or a stale
exemption, fails the test. What the test changes, and only that (``Substitutions``):

* the ports: every ``30000``, ``8000`` and ``8800`` (the core's, the proxy's and the cluster router's)
  becomes a free port of this document, so parallel runs never collide; a server command run in the foreground (as a user would,
  stopping it with Ctrl-C) listens on a fresh port of its own (``--port`` replaced, or added);
* ``./memt-state`` and ``./memt-proxy-state`` become directories under pytest's tmp path, so nothing is
  written into the clone;
* ``/models/MemT-1.0-Nano`` (a real checkpoint) becomes the bundled demo model, of the same family;
* a command ending in ``&`` starts a server kept for the rest of the document (``/health`` is polled
  before the next command); the interactive ``python -m memt_core.client`` reads a short script on stdin;
* ``bash scripts/start_cluster.sh`` (which runs until Ctrl-C) is kept running for the rest of the
  document, on free ports and a directory under the tmp path (its environment variables), once its
  router lists the model.

Meaningful output is checked where the bundled model answers deterministically (``EXPECTED``: greedy
answers it was trained to give).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from e2e.servers import HOST, REPO_ROOT, cluster_script_ports, free_port, free_port_block

pytestmark = pytest.mark.timeout(1200)

DOCS = sorted(str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "docs").glob("*.md"))
DOCUMENTS = ["README.md", *DOCS, "adapters/langchain-memt/README.md", "adapters/llama-index-llms-memt/README.md"]
LANGUAGES = {"bash", "python", "text"}  # text: not commands (the layout tree)
BUNDLED = "memt_core/bundled/memt-tiny-demo"

_PIP = "installs with pip (network); scripts/setup.sh dev installs the same into .venv, which this test activates instead"
#: Commands (as ``shlex.join`` of their words, before substitution) that this test does not run, and why.
EXEMPT = {
    "bash scripts/demo.sh": "installs with pip (network), then runs scripts/demo.py, which tests/e2e/test_demo.py runs",
    "bash scripts/test.sh": "the test suite itself (CI's .ci/run)",
    "pip install -e '.[client]'": _PIP,
    "pip install -e adapters/langchain-memt": _PIP,
    "pip install -e adapters/llama-index-llms-memt": _PIP,
}
#: Documents whose install block is exempt: the test activates the project's .venv in its place.
PREACTIVATED = {"adapters/langchain-memt/README.md", "adapters/llama-index-llms-memt/README.md"}

#: Per document, what a command or python block prints (it contains the key) when it works: greedy answers of
#: the demo model, or what identifies it.
EXPECTED = {"README.md": {
    'print(session.chat("What is my kitten called?"': ["Memmy"],
    "client.chat.completions.create(": ["Lisbon"],
    "client.responses.create(": ["Lisbon"],
    "ChatMemT(": ["Your parrot is called Belkavo."],
}, "docs/quickstart.md": {
    "examples/generate.py": ["You live in Lisbon."],
    "examples/document_memory.py": ["Apex Books is based in Marrakesh.", "Apex Books was founded in 1962."],
    "examples/commit_history.py": ["messages in the restored session: 0", "Your kitten is called Memmy."],
    "examples/langchain_chat.py": ["You live in Lisbon."],
    "examples/llamaindex_chat.py": ["Your name is Alice."],
    "python -m memt_core.client": ["You live in Lisbon."],
}, "docs/proxy.md": {
    "extra_headers={\"X-MemT-Session\": \"alice\"})\nhistory": ["Lisbon"],
    "tools=tools": ["get_weather", "Lisbon"],
    "stream=True": ["prompt tokens:"],
    "response_format=Place": ["city="],
    "MemT(": ["green"],
}, "docs/responses.md": {
    "client.responses.create(": ["Lisbon"],
    "Runner.run(": ["Lisbon"],
}, "docs/native.md": {
    "/memt/identity": ["memt-tiny-demo"],
    'print(session.chat("What is my kitten called?"': ["Memmy"],
}, "docs/deployment.md": {
    "--dry-run": ["memt-tiny-demo"],
    "client.chat.completions.create(": ["Lisbon"],
}, "docs/operations.md": {
    "memt_proxy --help": ["--headerless-memory"],
    "memt_core.launch --help": ["--snapshot-store"],
}, "adapters/langchain-memt/README.md": {
    'HumanMessage("What is my name?")': ["Your name is Alice."],
}, "adapters/llama-index-llms-memt/README.md": {
    'content="What is my name?"': ["Your name is Alice."],
}}
#: The interactive client's stdin: a fact, a question answered from memory, a command, and leave.
CLIENT_SCRIPT = "Hi, my name is Alice and I live in Lisbon.\nWhere do I live?\n/status\n/quit\n"


#: The marker that keeps the next block from running: ``<!-- not run: needs a CUDA machine -->``.
NOT_RUN = re.compile(r"^<!--\s*not run:(.*?)-->\s*$")


@dataclass
class Block:
    document: str
    line: int
    language: str
    text: str
    not_run: str | None = None  # the reason of a ``<!-- not run: … -->`` marker before the block


def fenced_blocks(document: str) -> list[Block]:
    """The document's fenced code blocks, in order, with the line each starts on and its not-run reason."""
    blocks, lines = [], (REPO_ROOT / document).read_text(encoding="utf-8").splitlines()
    start, marker = None, None
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            if start is None:
                start, language = number, line[3:].strip()
            else:
                blocks.append(Block(document, start, language, "\n".join(lines[start:number - 1]) + "\n", marker))
                start, marker = None, None
        elif start is None and (found := NOT_RUN.match(line.strip())):
            assert marker is None, f"{document}:{number}: two not-run markers before one block"
            marker = found.group(1).strip()
            assert marker, f"{document}:{number}: a not-run marker must say why (<!-- not run: REASON -->)"
        elif start is None and line.strip() and marker is not None:
            raise AssertionError(f"{document}:{number}: a not-run marker must stand right before its block")
    assert start is None, f"{document}: the block opened on line {start} is never closed"
    assert marker is None, f"{document}: a not-run marker at the end, before no block"
    return blocks


def runnable(document: str) -> bool:
    """Whether the document has a block this test runs."""
    return any(b.language in ("bash", "python") and b.not_run is None for b in fenced_blocks(document))


def bash_commands(block: Block) -> list[list[str]]:
    """The words of each command of a bash block (continuation lines joined, comments dropped)."""
    commands = []
    for line in block.text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


@dataclass
class Substitutions:
    """The changes the module docstring lists, for one document."""

    tmp: Path
    ports: dict[str, int] = field(default_factory=lambda: {"30000": free_port(), "8000": free_port(), "8800": free_port_block(2)})

    def __call__(self, text: str) -> str:
        for port, ours in self.ports.items():
            text = re.sub(rf"\b{port}\b", str(ours), text)
        for name in ("memt-state", "memt-proxy-state"):
            text = text.replace(f"./{name}", str(self.tmp / name))
        return text.replace("/models/MemT-1.0-Nano", BUNDLED)


def server_kind(words: list[str]) -> str | None:
    """``memt_core.launch`` or ``memt_proxy`` when the command starts a server (not --dry-run or --help)."""
    if words[:2] == ["python", "-m"] and len(words) > 2 and words[2] in ("memt_core.launch", "memt_proxy"):
        if not {"--dry-run", "--help", "-h"} & set(words):
            return words[2]
    return None


def clean_path_env() -> dict[str, str]:
    """The test's environment without its virtual environment: the document must activate one itself."""
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Reader:
    """Runs one document's blocks in order; collects failures instead of stopping at the first."""

    def __init__(self, document: str, tmp: Path):
        self.document, self.tmp = document, tmp
        self.sub = Substitutions(tmp)
        self.env = clean_path_env()
        self.servers: list[tuple[subprocess.Popen, Path]] = []
        self.failures: list[str] = []
        self.ran: list[str] = []
        self.exempted: set[str] = set()
        self.not_run: list[str] = []
        if document in PREACTIVATED:
            self.source(".venv/bin/activate")

    # ------------------------------------------------------------------ helpers

    def fail(self, block: Block, what: str, why: str) -> None:
        self.failures.append(f"{self.document}:{block.line}: {what}\n{why}")

    def source(self, script: str) -> None:
        """``. script``, as the document says; its environment applies to every later command."""
        done = subprocess.run(["bash", "-c", f". {shlex.quote(script)} && env -0"], cwd=REPO_ROOT, env=self.env,
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        self.env = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)

    def check(self, block: Block, what: str, output: str) -> None:
        for key, needed in EXPECTED.get(self.document, {}).items():
            if key in what:
                missing = [text for text in needed if text not in output]
                if missing:
                    self.fail(block, what, f"its output lacks {missing}:\n{output[-3000:]}")

    def run(self, block: Block, what: str, args: list[str], *, stdin: str | None = None) -> None:
        self.ran.append(what)
        try:
            done = subprocess.run(args, cwd=REPO_ROOT, env=self.env, input=stdin, capture_output=True, text=True, timeout=420)
        except subprocess.TimeoutExpired as exc:
            self.fail(block, what, f"did not finish in {exc.timeout} s")
            return
        output = done.stdout + done.stderr
        if done.returncode != 0:
            self.fail(block, what, f"exit code {done.returncode}:\n{output[-3000:]}")
            return
        if block.language == "python" and not done.stdout.strip():
            self.fail(block, what, "printed nothing")
        self.check(block, what, output)

    def start_server(self, block: Block, what: str, words: list[str], kind: str, *, foreground: bool) -> None:
        """Start a server command; background ones stay up, foreground ones are checked and stopped (Ctrl-C)."""
        self.ran.append(what)
        default = self.sub.ports["30000" if kind == "memt_core.launch" else "8000"]
        if "--port" in words:
            at = words.index("--port") + 1
            port = free_port() if foreground else int(words[at])
            words = words[:at] + [str(port)] + words[at + 1:]
        else:
            port = free_port() if foreground else default
            words = words + ["--port", str(port)]
        log = self.tmp / f"server-{len(self.servers)}.log"
        process = subprocess.Popen(words, cwd=REPO_ROOT, env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.servers.append((process, log))
        url = f"http://{HOST}:{port}"
        if not self.wait_healthy(process, url):
            self.fail(block, what, f"never answered {url}/health:\n{log.read_text()[-3000:]}")
            return
        probe = "/memt/identity" if kind == "memt_core.launch" else "/v1/models"
        answer = httpx.get(url + probe, timeout=30)
        if answer.status_code != 200:
            self.fail(block, what, f"GET {probe}: {answer.status_code} {answer.text[:500]}")
        if foreground:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.fail(block, what, "did not stop on Ctrl-C (SIGINT) within 60 s")

    def start_cluster(self, block: Block, what: str, words: list[str]) -> None:
        """The cluster script, kept up: its router on this document's 8800, the rest on free ports."""
        self.ran.append(what)
        port = self.sub.ports["8800"]
        nodes = int(words[2]) if len(words) > 2 else 3
        env = {**self.env, **cluster_script_ports(nodes), "MEMT_CLUSTER_PORT": str(port), "MEMT_CLUSTER_DIR": str(self.tmp / "cluster")}
        log = self.tmp / "cluster.log"
        process = subprocess.Popen(words, cwd=REPO_ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.servers.append((process, log))
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if '"id"' in httpx.get(f"http://{HOST}:{port}/v1/models", timeout=2).text:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.fail(block, what, f"the cluster's router never listed the model:\n{log.read_text()[-3000:]}")

    @staticmethod
    def wait_healthy(process: subprocess.Popen, url: str) -> bool:
        """Poll /health until it answers 200; False when the process exits or 300 s pass."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        for process, _ in self.servers:
            if process.poll() is None:
                process.terminate()
        for process, _ in self.servers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    # ------------------------------------------------------------------ blocks

    def bash(self, block: Block) -> None:
        for words in bash_commands(block):
            key = shlex.join(words)
            if key in EXEMPT:
                self.exempted.add(key)
                continue
            words = bash_commands(Block(block.document, block.line, "bash", self.sub(key)))[0]
            background = words[-1] == "&"
            if background:
                words = words[:-1]
            if words[0] in (".", "source"):
                self.source(words[1])
            elif kind := server_kind(words):
                self.start_server(block, key, words, kind, foreground=not background)
            elif background:
                self.fail(block, key, "a background command that is not a server: the test does not know what to wait for")
            elif words[:2] == ["bash", "scripts/start_cluster.sh"]:
                self.start_cluster(block, key, words)
            elif words[:3] == ["python", "-m", "memt_core.client"]:
                self.run(block, key, words, stdin=CLIENT_SCRIPT)
            else:
                self.run(block, key, ["bash", "-c", shlex.join(words)])

    def python(self, block: Block) -> None:
        self.run(block, block.text, ["python", "-"], stdin=self.sub(block.text))

    def read(self) -> None:
        for block in fenced_blocks(self.document):
            if block.not_run is not None:
                self.not_run.append(f"{block.line}: {block.not_run}")
            elif block.language == "bash":
                self.bash(block)
            elif block.language == "python":
                self.python(block)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_fenced_block_is_tagged(document):
    """A block the runner would skip silently (no language, or an unknown one) fails here instead."""
    untagged = [(b.line, b.language) for b in fenced_blocks(document) if b.language not in LANGUAGES]
    assert not untagged, f"{document}: tag these blocks bash, python or text: {untagged}"


def test_every_exemption_is_still_in_a_document():
    """A stale exemption would hide nothing today but lets a same-named command in later untested."""
    commands = {shlex.join(words) for d in DOCUMENTS for b in fenced_blocks(d) if b.language == "bash" for words in bash_commands(b)}
    assert not set(EXEMPT) - commands, sorted(set(EXEMPT) - commands)


def test_every_example_is_run_by_a_readme_command():
    """examples/*.py are run through the README or the docs (so a new example needs a line there, and then runs)."""
    commands = [shlex.join(words) for d in ["README.md", *DOCS] for b in fenced_blocks(d)
                if b.language == "bash" and b.not_run is None for words in bash_commands(b)]
    missing = [p.name for p in sorted((REPO_ROOT / "examples").glob("*.py")) if not any(f"examples/{p.name}" in c for c in commands)]
    assert not missing, f"examples that no README command runs: {missing}"


IN_VENV = "python -c 'import sys; assert sys.prefix.endswith(\".venv\"), sys.prefix'"


def test_the_reader_reports_what_fails(tmp_path):
    """The runner can fail: python without the activate line, a failing command, a silent snippet."""
    document = tmp_path / "DOC.md"
    document.write_text(
        f"```bash\n{IN_VENV}\n```\n"  # before the activate line: another python, or none
        f"```bash\n. .venv/bin/activate\n{IN_VENV}\npython -c 'import sys; sys.exit(3)'\n```\n"
        "```python\nx = 1\n```\n"
    )
    reader = Reader(str(document), tmp_path)
    reader.read()
    assert len(reader.ran) == 4
    assert [failure.splitlines()[0] for failure in reader.failures] == [
        f"{document}:1: {IN_VENV}",
        f"{document}:4: python -c 'import sys; sys.exit(3)'",
        f"{document}:9: x = 1",
    ]
    assert "exit code 3" in reader.failures[1] and "printed nothing" in reader.failures[2]


def test_a_not_run_marker_skips_its_block_and_must_say_why(tmp_path):
    """``<!-- not run: … -->`` skips the next block only; a marker without a reason or a block is an error."""
    document = tmp_path / "DOC.md"
    document.write_text("<!-- not run: needs a GPU -->\n```bash\nexit 3\n```\n```bash\ntrue\n```\n")
    reader = Reader(str(document), tmp_path)
    reader.read()
    assert reader.not_run == ["2: needs a GPU"] and reader.ran == ["true"] and not reader.failures
    for text in ("<!-- not run: -->\n```bash\ntrue\n```\n", "<!-- not run: x -->\nprose\n```bash\ntrue\n```\n",
                 "```bash\ntrue\n```\n<!-- not run: x -->\n"):
        document.write_text(text)
        with pytest.raises(AssertionError, match="not-run marker"):
            fenced_blocks(str(document))


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if runnable(d)])
def test_document_runs_line_by_line(document, tmp_path):
    """Every command and snippet of the document runs as written (see the module docstring) and says what it should."""
    reader = Reader(document, tmp_path)
    try:
        reader.read()
    finally:
        reader.stop()
    assert not reader.failures, "\n\n".join(reader.failures)
    assert reader.ran, f"{document}: nothing ran"
    unmatched = [key for key in EXPECTED.get(document, {}) if not any(key in what for what in reader.ran)]
    assert not unmatched, f"{document}: expected outputs whose command or snippet is no longer there: {unmatched}"


@pytest.mark.parametrize(("script", "args", "printed"), [
    ("scripts/start_memt_nano.sh", [BUNDLED, "--dry-run"], '"checkpoint_id": "memt-tiny-demo"'),
    ("scripts/start_memt_flash.sh", [BUNDLED, "--help"], "usage: python -m memt_core.launch"),  # its settings need a real Flash
    ("scripts/start_proxy.sh", ["--help"], "usage: python -m memt_proxy"),
])
def test_start_scripts_find_the_venv(script, args, printed, tmp_path):
    """The README's start scripts run from a shell without the venv on PATH and without MEMT_PYTHON (issue 16)."""
    env = clean_path_env()
    env.pop("MEMT_PYTHON", None)
    env["MEMT_STATE_DIRECTORY"] = str(tmp_path / "state")
    done = subprocess.run(["sh", script, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert printed in done.stdout, done.stdout[-2000:]


#: Commands quoted in the README's prose that wrap a python script: their flags are that script's.
WRAPPERS = {"scripts/demo.sh": ["scripts/demo.py"]}
#: Shell scripts quoted in the prose that answer ``--help`` themselves, listing their flags, without side effects.
SHELL_HELP = {"scripts/setup.sh", "scripts/test.sh", "scripts/reliability.sh"}


def prose_commands() -> list[str]:
    """The inline code spans outside fenced blocks, in the README and the docs, that are python or bash commands."""
    spans = []
    for document in ["README.md", *DOCS]:
        text = re.sub(r"^```.*?^```", "", (REPO_ROOT / document).read_text(encoding="utf-8"), flags=re.S | re.M)
        spans += re.findall(r"`([^`]+)`", text)
    return sorted({" ".join(span.split()) for span in spans if re.match(r"(python|bash) \S", span)})


def test_every_command_quoted_in_the_prose_exists_with_its_flags():
    """Commands named in passing (benchmarks, training, CLI forms) exist and accept the flags quoted with them.

    They are too long to run here (training takes an hour); their ``--help`` answers and lists each
    flag the README gives them, so a renamed script or flag fails this test.
    """
    commands = prose_commands()
    assert "python scripts/train_tiny.py" in commands, commands  # the parser found the prose
    helps: dict[tuple[str, ...], str] = {}
    problems = []
    for command in commands:
        words = shlex.split(command.replace("[", " ").replace("]", " "))
        if words[0] == "python":
            target = words[1:3] if words[1] == "-m" else words[1:2]
        elif words[1] in WRAPPERS:
            target = WRAPPERS[words[1]]
        elif words[1] in SHELL_HELP:
            target = ["bash", words[1]]
        else:
            target = None
            if not (REPO_ROOT / words[1]).is_file():
                problems.append(f"{command}: no {words[1]}")
        flags = [w.split("=")[0] for w in words if w.startswith("--")]
        if target is None:
            if flags:
                problems.append(f"{command}: flags for a script this test cannot ask (add it to WRAPPERS)")
            continue
        if tuple(target) not in helps:
            runner = [] if target[0] == "bash" else [sys.executable]
            done = subprocess.run([*runner, *target, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
            helps[tuple(target)] = done.stdout if done.returncode == 0 else ""
            if done.returncode != 0:
                problems.append(f"{command}: `{' '.join(target)} --help` exit code {done.returncode}: {done.stderr[-1000:]}")
        problems += [f"{command}: {' '.join(target)} has no {flag}" for flag in flags if flag not in helps[tuple(target)]]
    assert not problems, "\n".join(problems)
