"""Live OpenAI-compatible proxies for end-to-end tests: ``python -m memt_proxy`` in a subprocess.

``ProxyServer`` starts the real proxy on 127.0.0.1 (ephemeral port) in front of a live memt_core
server (``e2e.servers.MemTServer``), waits for ``GET /health`` and tears it down again. Tests talk to
it with the official ``openai`` SDK (``proxy.openai(key)`` / ``proxy.async_openai(key)``) or raw
``httpx`` (``proxy.http(key)``) when they check exact wire shapes.

Fixtures (session scope, shared by every ``tests/e2e/test_proxy_*.py`` module; registered in
``tests/e2e/conftest.py`` so that all modules share one instance of each):

* ``proxy_upstream`` — a Nano memt_core server on the tiny random checkpoint for the proxy tests
  (room for many sessions, a state directory for snapshots).
* ``proxy`` — the proxy in front of it with two tenants (``KEYS``: ``key-alpha`` → ``alpha``,
  ``key-beta`` → ``beta``) and ``--lease-wait LEASE_WAIT``.
* ``proxy_chat_format`` — the checkpoint's ``ChatFormat``, to compute the prompt the proxy must send.
* ``demo_proxy`` — core + proxy (no API keys) on the bundled demo model, or ``$MEMT_DEMO_MODEL``; the
  tests that need a trained model (tool calls, recall through memory) FAIL, not skip, without it.
* ``long_seed`` — a sampling seed with which ``LONG_MESSAGES`` generates ``LONG_TOKENS`` tokens
  without an end token: a stream that lasts a few seconds on a small CPU machine, well over
  ``LEASE_WAIT`` (the one-request-per-session test relies on that).

``say`` appends one completed turn (question and answer) to a history. ``expected_prompt``
recomputes, independently of the proxy's own bookkeeping, the prompt a session request must produce:
BOS + system block + uncommitted earlier messages as context + the open turn.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
from e2e.servers import HOST, REPO_ROOT, MemTServer, free_port, wait_healthy

from memt_demo import BUNDLED_MODEL

MODEL = "tiny-random-nano"
#: The demo checkpoint: the bundled one, or $MEMT_DEMO_MODEL (e.g. a freshly trained candidate).
DEMO_PATH = Path(os.environ.get("MEMT_DEMO_MODEL") or BUNDLED_MODEL)
DEMO_MODEL = "memt-tiny-demo"
KEYS = {"key-alpha": "alpha", "key-beta": "beta"}
KEY_A, KEY_B = "key-alpha", "key-beta"
LEASE_WAIT = 1.5
LONG_TOKENS = 400
STOPS = [" ", "e"]  # frequent in the random model's text: most turns end with finish_reason "stop"
LONG_MESSAGES = [{"role": "user", "content": "Please keep talking for a long time."}]


def unique(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class ProxyServer:
    """One ``python -m memt_proxy`` process."""

    def __init__(self, upstream: str, model_path: str | Path, *, args: list[str] = (), startup_timeout: float = 120.0):
        self.upstream = upstream
        self.model_path = Path(model_path)
        self.args = list(args)
        self.port = free_port()
        self.startup_timeout = startup_timeout
        self.log_path = Path(tempfile.mkstemp(prefix="memt-proxy-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "memt_proxy", "--upstream", self.upstream, "--model-path", str(self.model_path),
            "--host", HOST, "--port", str(self.port), "--log-level", "warning", *self.args,
        ]

    def start(self) -> "ProxyServer":
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        wait_healthy(self, "proxy", on_timeout=self.stop)
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if not self.running:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------------------------ clients

    def openai(self, key: str = KEY_A, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=kwargs.pop("timeout", 120.0), **kwargs)

    def async_openai(self, key: str = KEY_A, **kwargs):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=kwargs.pop("timeout", 120.0), **kwargs)

    def http(self, key: str | None = KEY_A, *, timeout: float = 120.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def inspect(self, session: str, key: str = KEY_A) -> dict:
        with self.http(key) as http:
            response = http.get(f"/v1/memt/sessions/{session}")
        assert response.status_code == 200, response.text
        return response.json()

    def __enter__(self) -> "ProxyServer":
        return self.start() if not self.running else self

    def __exit__(self, *exc) -> None:
        self.stop()


def ask(client, messages, session=None, *, memory="auto", seed=0, max_tokens=24, stop=STOPS, **extra):
    headers = {}
    if session is not None:
        headers = {"X-MemT-Session": session, "X-MemT-Memory": memory, **extra.pop("headers", {})}
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=1.0, seed=seed, stop=stop,
        extra_headers=headers, **extra,
    )


def leave_stream_early(proxy: "ProxyServer", session: str, seed: int, *, key: str | None = KEY_A, frames: int = 5) -> None:
    """Start a long stream (``LONG_MESSAGES``, ``seed``) on ``session`` and close the connection after ``frames`` frames."""
    body = {"model": MODEL, "messages": LONG_MESSAGES, "max_tokens": LONG_TOKENS, "temperature": 1.0, "seed": seed, "stream": True}
    with proxy.http(key) as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-MemT-Session": session}) as response:
            assert response.status_code == 200
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data:")
                if seen >= frames:
                    break  # leaving the block closes the connection mid-stream


def completed_turn(client, session, messages, *, seed=0):
    """Ask until a seed gives a completed (finish_reason "stop") turn; returns the response."""
    for s in range(seed, seed + 20):
        response = ask(client, messages, session, seed=s)
        if response.choices[0].finish_reason == "stop":
            return response
    pytest.fail("no completed turn in 20 seeds")


def say(client, history: list[dict], text: str, session: str):
    """One completed turn (a stop string ends it), appended to ``history``."""
    history.append({"role": "user", "content": text})
    reply = completed_turn(client, session, history)
    history.append({"role": "assistant", "content": reply.choices[0].message.content})
    return reply


def assert_openai_error(response: httpx.Response, status: int, *, type: str | None = None, code: str | None = None, param: str | None = "<any>") -> dict:
    """``status`` with exactly ``{"error": {"message", "type", "param", "code"}}``; returns the error object."""
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    if type is not None:
        assert error["type"] == type, error
    if code is not None:
        assert error["code"] == code, error
    if param != "<any>":
        assert error["param"] == param, error
    return error


def expected_prompt(chat_format, messages: list[dict], committed: int | None, *, tools: list | None = None, thinking: bool = False) -> list[int]:
    """The prompt ids for ``messages``: stateless when ``committed`` is None, else with the first
    ``committed`` conversation messages in memory (the rest of the earlier ones sent as context)."""
    if committed is None:
        return chat_format.conversation_ids(messages, tools=tools, enable_thinking=thinking)
    system = "\n\n".join(m["content"] for m in messages if m["role"] in ("system", "developer")) or None
    conversation = [m for m in messages if m["role"] not in ("system", "developer")]
    last_user = max(i for i, m in enumerate(conversation) if m["role"] == "user")
    context = conversation[committed:last_user]
    return (
        list(chat_format.bos_ids)
        + chat_format.system_ids(system, tools)
        + chat_format.history_ids(context)
        + chat_format.open_turn_ids(conversation[last_user:], enable_thinking=thinking)
    )


def assistant(message) -> dict:
    """An SDK response message as an app would append it to its history."""
    out = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    return out


@functools.cache
def demo_chat_format():
    """The bundled demo model's chat format (token ids of turns, tool results, …)."""
    from memt_core.client.chat_format import load_chat_format, load_tokenizer

    return load_chat_format(DEMO_PATH, tokenizer=load_tokenizer(DEMO_PATH))[0]


def upstream_metric(server: MemTServer, name: str) -> float:
    with server.client() as http:
        text = http.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def proxy_metric(proxy: ProxyServer, name: str) -> float:
    """A counter or gauge of the proxy's /metrics, summed over its labels."""
    with proxy.http() as http:
        text = http.get("/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def writes_reach(proxy: ProxyServer, count: int) -> float:
    """The proxy's write counter once it reaches ``count`` (writes land behind answers), polled up to 60 s."""
    deadline = time.monotonic() + 60
    while (value := proxy_metric(proxy, "memt_proxy_memory_writes_total")) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


# ---------------------------------------------------------------------- fixtures


@pytest.fixture
def fresh_proxy(proxy_upstream, nano_checkpoint, tmp_path):
    """A proxy of the test's own (two tenants, as ``proxy``) on the shared upstream: its counters move only by what the test does."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(KEYS))
    with ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--api-keys-file", str(keys)]) as server:
        yield server


@pytest.fixture(scope="session")
def proxy_upstream(nano_checkpoint, tmp_path_factory):
    server = MemTServer(
        nano_checkpoint, state_directory=tmp_path_factory.mktemp("proxy-upstream-state"),
        args=["--max-sessions-per-rank", "256"],
    ).start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def proxy(proxy_upstream, nano_checkpoint, tmp_path_factory):
    keys = tmp_path_factory.mktemp("proxy-keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    server = ProxyServer(proxy_upstream.url, nano_checkpoint, args=["--api-keys-file", str(keys), "--lease-wait", str(LEASE_WAIT)]).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def proxy_chat_format(nano_checkpoint):
    from memt_core.client.chat_format import load_chat_format, load_tokenizer

    return load_chat_format(nano_checkpoint, tokenizer=load_tokenizer(nano_checkpoint))[0]


@pytest.fixture(scope="session")
def long_seed(proxy) -> int:
    """A seed whose stateless generation for LONG_MESSAGES runs to LONG_TOKENS without an end token.

    A memory query on a session with empty memory generates the same tokens as stateless chat (the
    proxy tests check that), so the seed also gives long streams on fresh sessions.
    """
    client = proxy.openai()
    for seed in range(40):
        response = client.chat.completions.create(
            model=MODEL, messages=LONG_MESSAGES, max_tokens=LONG_TOKENS, temperature=1.0, seed=seed,
        )
        if response.choices[0].finish_reason == "length":
            return seed
    pytest.fail(f"no seed in 0..39 generates {LONG_TOKENS} tokens without an end token")


@pytest.fixture(scope="session")
def demo_proxy(tmp_path_factory):
    if not (DEMO_PATH / "config.json").is_file():
        pytest.fail(f"the bundled demo model is missing at {DEMO_PATH} (train it with `python scripts/train_tiny.py`)", pytrace=False)
    # the whole test session's proxies share this core and leave their sessions on it (a stopped proxy keeps
    # them for its restart): room for all of them, as proxy_upstream has
    upstream = MemTServer(
        DEMO_PATH, state_directory=tmp_path_factory.mktemp("demo-state"), args=["--max-sessions-per-rank", "256"],
    ).start()
    try:
        # other proxies share this core (durable ones, the demo script's): this one's header-less states keep to a
        # quarter of its sessions, as docs/proxy.md tells an operator with several proxies on one upstream
        with ProxyServer(upstream.url, DEMO_PATH, args=["--max-memory-states", "64"]) as proxy:
            yield proxy
    finally:
        upstream.close()
