"""Live memt-http-v1 servers for end-to-end tests: the real launcher in a subprocess on 127.0.0.1.

``MemTServer`` runs ``python -m memt_core.launch`` with a checkpoint, an ephemeral port and a state
directory, waits for ``GET /health`` and tears the process down again::

    server = MemTServer(checkpoint, state_directory=tmp / "state", api_key="k").start()
    # (snapshots=False: no --state-directory; extra launcher flags go in args=[...])
    with server.client() as http:          # httpx.Client with base_url and the Bearer key
        epoch = server.epoch()
    server.restart()                       # same port and state directory, new epoch
    server.kill()                          # SIGKILL, as a crash would
    server.stop()                          # SIGTERM, then SIGKILL if it lingers

Fixtures (import them into a conftest to use them elsewhere, e.g.
``from e2e.servers import nano_server, flash_server, memt_servers``):

* ``nano_server`` / ``flash_server`` — one shared server per test session on the tiny checkpoints of
  ``tests/conftest.py``. Tests sharing them must use their own session IDs and must not restart,
  kill or fill them (use ``memt_servers`` for that).
* ``memt_servers`` — a factory, ``memt_servers(checkpoint, *launcher_args, api_key=None)``, whose
  servers are stopped at the end of the test.

Servers default to ``--device cpu``, one torch thread and ``--log-level warning``; their output goes
to ``server.log_path`` and is quoted when startup fails.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


#: Ports this test process has handed out: never handed out twice, though a server may not have bound one yet.
_HANDED_OUT: set[int] = set()
_PORTS = random.Random()


def free_port() -> int:
    """A TCP port nobody listens on right now, below the kernel's ephemeral range (see :func:`free_port_block`)."""
    return free_port_block(1)


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive free ports, below the kernel's ephemeral range (32768 up).

    Ports there are not taken as the local side of outgoing connections between the moment they are
    chosen and the moment a server binds them; scripts that listen on BASE+i get the whole block.
    """
    for _ in range(500):
        base = _PORTS.randrange(20000, 32000 - count)
        block = range(base, base + count)
        if _HANDED_OUT.intersection(block):
            continue
        sockets = []
        try:
            for port in block:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind((HOST, port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        _HANDED_OUT.update(block)
        return base
    raise RuntimeError(f"no {count} consecutive free ports between 20000 and 32000")


def cluster_script_ports(nodes: int) -> dict[str, str]:
    """``scripts/start_cluster.sh``'s port variables for ``nodes`` nodes: cores, then proxies, then Redis,
    one block with no overlap (the script listens on BASE+i)."""
    base = free_port_block(2 * nodes + 1)
    return {"MEMT_CORE_PORT": str(base), "MEMT_PROXY_PORT": str(base + nodes), "MEMT_REDIS_PORT": str(base + 2 * nodes)}


class ServerStartError(RuntimeError):
    """The server process exited or did not answer /health in time; carries the log's tail."""


def wait_healthy(server, what: str, *, on_timeout) -> None:
    """Poll ``server.url``/health until it answers 200; its process exiting or ``server.startup_timeout`` raises
    ServerStartError, saying what /health last answered (a server warming up says how far it is) and the log's tail."""
    started = time.monotonic()
    deadline = started + server.startup_timeout
    last = "no answer yet"
    while True:
        if server.process.poll() is not None:
            raise ServerStartError(f"{what} exited with code {server.process.returncode} during startup:\n{server.log_tail()}")
        try:
            response = httpx.get(server.url + "/health", timeout=2.0)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:400]}"
        except httpx.HTTPError as exc:
            last = f"no answer ({type(exc).__name__})"
        if time.monotonic() > deadline:
            on_timeout()
            raise ServerStartError(
                f"{what} was not ready within {server.startup_timeout:.0f} s; /health last answered: {last}\n{server.log_tail()}"
            )
        time.sleep(0.1)


def startup_timeout_default() -> float:
    """Seconds a test waits for a server's /health 200: ``MEMT_TEST_STARTUP_TIMEOUT``, else 180."""
    return float(os.environ.get("MEMT_TEST_STARTUP_TIMEOUT", "180"))


class MemTServer:
    """One ``python -m memt_core.launch`` process; see the module docstring."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        state_directory: str | Path | None = None,
        api_key: str | None = None,
        args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
        device: str = "cpu",
        snapshots: bool = True,
        startup_timeout: float | None = None,
    ):
        self.model_path = Path(model_path)
        self._own_state = snapshots and state_directory is None
        self.state_directory: Path | None = None  # snapshots=False: the server runs without --state-directory
        if snapshots:
            self.state_directory = Path(state_directory) if state_directory else Path(tempfile.mkdtemp(prefix="memt-state-"))
        self.api_key = api_key
        self.args = list(args)
        self.extra_env = dict(env or {})
        self.port = port or free_port()
        self.device = device
        self.startup_timeout = startup_timeout_default() if startup_timeout is None else startup_timeout
        self.log_path = Path(tempfile.mkstemp(prefix="memt-server-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None
        self.starts = 0

    # ------------------------------------------------------------------ addresses and clients

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, *, timeout: float = 120.0, **kwargs) -> httpx.Client:
        """An ``httpx.Client`` on this server, sending the API key when the server has one."""
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, **kwargs)

    def async_client(self, *, timeout: float = 120.0, **kwargs) -> httpx.AsyncClient:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, **kwargs)

    def capabilities(self) -> dict:
        with self.client() as http:
            response = http.get("/memt/capabilities")
            response.raise_for_status()
            return response.json()

    def epoch(self) -> str:
        """The epoch of the running server process (new at every start)."""
        return self.capabilities()["epoch"]

    def wait_unloaded(self, native: str, timeout: float = 120.0) -> None:
        """Return once this server no longer holds the native session (``--unload-idle`` let it go after its
        lease was released): state, not a sleep."""
        deadline = time.monotonic() + timeout
        with self.client() as http:
            epoch = http.get("/memt/capabilities").json()["epoch"]
            while http.post("/memt/control", json={"action": "inspect", "session": native, "epoch": epoch}).status_code == 200:
                assert time.monotonic() < deadline, f"the server never unloaded the idle session {native}"
                time.sleep(0.05)

    # ------------------------------------------------------------------ process lifecycle

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "memt_core.launch",
            "--model-path", str(self.model_path),
            "--host", HOST, "--port", str(self.port),
            "--device", self.device, "--log-level", "warning",
        ]
        if self.state_directory is not None:
            command += ["--state-directory", str(self.state_directory)]
        if self.api_key:
            command += ["--api-key", self.api_key]
        return command + self.args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.setdefault("OMP_NUM_THREADS", "1")  # tiny models; the test machine has few cores
        env.setdefault("MKL_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> "MemTServer":
        """Start the process and wait until ``GET /health`` answers 200."""
        if self.running:
            raise RuntimeError("server already running")
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                self.command(), cwd=REPO_ROOT, env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            log.close()
        self.starts += 1
        wait_healthy(self, "server", on_timeout=self.kill)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful shutdown (SIGTERM); SIGKILL when it does not exit within ``timeout``."""
        if not self.running:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would; waits until the process is gone."""
        if not self.running:
            return
        self.process.kill()
        self.process.wait(30)

    def restart(self, *, kill: bool = False) -> "MemTServer":
        """Stop (or SIGKILL) and start again on the same port and state directory: a new epoch."""
        self.kill() if kill else self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and delete the state directory if this object created it."""
        self.stop()
        if self._own_state and self.state_directory is not None:
            shutil.rmtree(self.state_directory, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> "MemTServer":
        return self.start() if not self.running else self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MemTServer({self.model_path.name}, url={self.url}, running={self.running})"


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def nano_server(nano_checkpoint, tmp_path_factory):
    """A shared Nano server for the whole test session (defaults of the tiny checkpoint)."""
    server = MemTServer(nano_checkpoint, state_directory=tmp_path_factory.mktemp("nano-server-state")).start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def flash_server(flash_checkpoint, tmp_path_factory):
    """A shared Flash server for the whole test session."""
    server = MemTServer(flash_checkpoint, state_directory=tmp_path_factory.mktemp("flash-server-state")).start()
    yield server
    server.close()


@pytest.fixture
def memt_servers(tmp_path):
    """Factory for servers of one test: ``memt_servers(checkpoint, *args, api_key=None, start=True)``."""
    servers: list[MemTServer] = []

    def make(checkpoint, *args: str, api_key: str | None = None, start: bool = True, **kwargs) -> MemTServer:
        state = kwargs.pop("state_directory", None) or (tmp_path / f"state-{len(servers)}" if kwargs.get("snapshots", True) else None)
        server = MemTServer(checkpoint, state_directory=state, api_key=api_key, args=args, **kwargs)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.close()
