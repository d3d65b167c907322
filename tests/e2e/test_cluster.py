"""Scale-out, live: core+proxy pairs on one snapshot store and one Redis, SMG in front (``SMG_ROUTING``: routing
keys pinned, header-less requests by prefix).

Clients talk to SMG with the OpenAI SDK, naming the session in ``X-SMG-Routing-Key`` (the header SMG routes by
and forwards). The tests check what the router cannot know: every turn of a session lands on one node;
a node killed with SIGKILL loses no published version (its sessions continue elsewhere, trimmed from the
shared records, once its ownership leases lapse); a node added back takes back exactly the sessions
pinned to it; a planned drain hands a node's sessions off; Responses chains and conversations continue on
another node from the shared records; header-less conversations (no header at all) are routed to the node
that keeps their state; per-request controls reach the proxy in the body's ``metadata`` (SMG drops the
``X-MemT-*`` headers). The CI size is 12 sessions × 3 turns; ``MEMT_CLUSTER_FULL=1`` runs the issue's
60 × 10. Skipped, saying why, without ``smg`` or ``redis-server``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from coordination import redis_server_binary, redis_url  # noqa: F401  (redis_url: a pytest fixture)
from e2e.proxies import STOPS, ProxyServer, expected_prompt, unique
from e2e.servers import HOST, REPO_ROOT, MemTServer, cluster_script_ports, free_port
from memt_proxy.http.cluster import SMG_ROUTING
from memt_proxy.session.sessions import native_session_id

FULL = os.environ.get("MEMT_CLUSTER_FULL") == "1"
SESSIONS, TURNS = (60, 10) if FULL else (12, 3)
OWNERSHIP_TTL = "2"  # seconds a killed node's sessions stay owned
UNLOAD_IDLE, LEASE_IDLE = "3", "1"  # seconds (the defaults, 60 and 30, suit real deployments)
WAIT = 120.0  # seconds a session may take to continue after a node leaves (health checks, lease lapse)
ROUTED = "x-smg-routed-worker-id"


def smg_binary() -> str:
    beside = Path(sys.executable).with_name("smg")
    found = str(beside) if beside.exists() else shutil.which("smg")
    if found is None:
        pytest.skip("smg is not installed (pip install 'memt-serve[cluster]')")
    return found


class Router:
    """One ``smg launch`` process: the cluster's routing (``SMG_ROUTING``) over the proxies, /health/ready as the health check."""

    def __init__(self, workers: list[str]):
        self.binary = smg_binary()
        self.workers = workers
        self.port, self.metrics_port = free_port(), free_port()
        self.log_path = Path(tempfile.mkstemp(prefix="memt-smg-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, model: str) -> "Router":
        command = [
            self.binary, "launch", "--host", HOST, "--port", str(self.port),
            "--prometheus-host", HOST, "--prometheus-port", str(self.metrics_port),
            *SMG_ROUTING, "--worker-urls", *self.workers,
            "--health-check-endpoint", "/health/ready", "--health-check-interval-secs", "1",
            "--health-failure-threshold", "1", "--health-success-threshold", "1",
            "--disable-retries", "--shutdown-grace-period-secs", "1", "--log-level", "warn",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while self.healthy() != set(self.workers):  # every worker registered, healthy, serving the model
            assert self.process.poll() is None, f"smg exited:\n{self.log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"smg did not register its workers:\n{self.log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        models = httpx.get(self.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [model]
        return self

    def healthy(self) -> set[str]:
        try:
            workers = httpx.get(self.url + "/workers", timeout=5).json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError):
            return set()
        return {w["url"] for w in workers if w.get("is_healthy")}

    def wait_healthy(self, expected: set[str]) -> None:
        deadline = time.monotonic() + WAIT
        while self.healthy() != expected:
            assert time.monotonic() < deadline, f"SMG's healthy workers stayed {self.healthy()}, expected {expected}"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)


class Node:
    """A core (on the shared store, owned through Redis) and its proxy (--cluster, shared records)."""

    def __init__(self, name: str, checkpoint, store: Path, records: Path, redis: str):
        self.name = name
        self.core = MemTServer(checkpoint, args=[
            "--snapshot-store", str(store), "--ownership", redis, "--ownership-ttl", OWNERSHIP_TTL, "--node-id", name,
            "--unload-idle", UNLOAD_IDLE,  # a session idle here (no lease) is let go, so a node that joins can take it
        ])
        self.proxy_args = ["--cluster", "--records-directory", str(records), "--state-directory", tempfile.mkdtemp(prefix=f"memt-{name}-"),
                           "--lease-idle", LEASE_IDLE]
        self.proxy = ProxyServer(self.core.url, checkpoint, args=self.proxy_args)

    @property
    def url(self) -> str:
        return self.proxy.url

    def start(self) -> "Node":
        self.core.start()
        self.proxy.start()
        return self

    def kill(self) -> None:
        """SIGKILL both processes, as a lost machine."""
        for process in (self.proxy.process, self.core.process):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(30)

    def stop(self) -> None:
        self.proxy.stop()
        self.core.close()

    def inspect(self, session: str) -> dict:
        response = httpx.get(f"{self.url}/v1/memt/sessions/{session}", timeout=60)
        assert response.status_code == 200, response.text
        return response.json()


def trimmed(chat_format, conversation: "Conversation", *, uncommitted: tuple[int, ...] = (0,)) -> bool:
    """Whether the proxy sent the last turn trimmed: the earlier messages in memory, but for the last
    ``uncommitted`` of them (sent as context), not the whole transcript."""
    sent, prompt_tokens = conversation.prompts[-1]
    return prompt_tokens in {len(expected_prompt(chat_format, sent, len(sent) - 1 - n)) for n in uncommitted}


def stored_version(store: Path, session: str) -> int:
    """The session's latest published version in the shared snapshot store (tenant 'default')."""
    manifest = store / "sessions" / f"{native_session_id('default', session)}.json"
    return json.loads(manifest.read_text())["version"]


class Conversation:
    """One session's transcript, sent whole each turn through SMG with the OpenAI SDK (the proxy trims it)."""

    def __init__(self, router: Router, name: str, *, routing_key: bool = True):
        from openai import OpenAI

        self.name, self.routing_key = name, routing_key
        self.messages: list[dict] = []
        headers = {"X-SMG-Routing-Key": name} if routing_key else {}  # without: a header-less conversation
        self.client = OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=120, default_headers=headers)
        self.nodes: list[str] = []  # the worker that answered each turn
        self.prompts: list[tuple[list[dict], int]] = []  # each turn's messages and the prompt tokens the proxy sent

    def turn(self, text: str, **extra) -> str:
        """One completed turn (``extra``: more arguments of the SDK's ``create``); returns the worker that served it."""
        sent = [*self.messages, {"role": "user", "content": text}]
        for attempt in range(8):
            raw = self.client.chat.completions.with_raw_response.create(
                model=MODEL_NAME, messages=sent, max_tokens=24, stop=STOPS, seed=len(self.messages) + 1000 * attempt, **extra,
            )
            completion = raw.parse()
            choice = completion.choices[0]
            # a named session commits completed answers only (a reply cut by max_tokens stays context: asked again,
            # with another seed); without a header a cut answer is kept too (closed as the transcript closes it)
            if choice.finish_reason == "stop" or not self.routing_key:
                break
        assert choice.finish_reason in ("stop", "length") and (choice.finish_reason == "stop" or not self.routing_key), choice.finish_reason
        reply = choice.message.content
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        node = raw.headers[ROUTED]
        self.nodes.append(node)
        self.prompts.append((sent, completion.usage.prompt_tokens))
        return node

    def turn_when_possible(self, text: str) -> tuple[str, list[int]]:
        """``turn``, retried while the session is between nodes; returns the worker and the refusals' statuses."""
        import openai

        refused, deadline = [], time.monotonic() + WAIT
        while True:
            try:
                return self.turn(text), refused
            except openai.APIStatusError as exc:
                # 409: still owned by the lost node; SMG's 500 call_upstream_* or read_response_body_failed: sent to
                # (or answered by) the dead node before its health check failed; 502-504: the router or proxy saw it die
                lost = exc.status_code == 500 and any(f"'code': '{code}" in str(exc) for code in ("call_upstream_", "read_response_body_failed"))
                assert exc.status_code in (409, 502, 503, 504) or lost, exc
                refused.append(exc.status_code)
            except openai.APIConnectionError:
                refused.append(0)
            assert time.monotonic() < deadline, f"{self.name} never continued: {refused[-5:]}"
            time.sleep(0.2)


MODEL_NAME = "tiny-random-nano"


@pytest.fixture
def cluster(nano_checkpoint, redis_url, tmp_path):  # noqa: F811  (redis_url is the fixture)
    """Three nodes and the router; yields (router, nodes, store)."""
    smg_binary()
    store, records = tmp_path / "store", tmp_path / "records"
    nodes = [Node(f"node{i}", nano_checkpoint, store, records, redis_url) for i in range(3)]
    router = None
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(Node.start, nodes))
        router = Router([node.url for node in nodes]).start(MODEL_NAME)
        yield router, nodes, store
    finally:
        if router is not None:
            router.stop()
        for node in nodes:
            node.stop()


def run_turns(conversations: list[Conversation], turns: range) -> None:
    def talk(conversation: Conversation) -> None:
        for t in turns:
            conversation.turn(f"Turn {t} of {conversation.name}.")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(talk, conversations))


def test_sessions_stay_on_one_node_survive_a_killed_node_and_only_remapped_ones_move_back(cluster, proxy_chat_format):
    """Sticky routing; SIGKILL of a node loses no published version and its sessions continue elsewhere with
    their transcripts still trimmed; the node's return moves back exactly the sessions pinned to it."""
    router, nodes, store = cluster
    by_url = {node.url: node for node in nodes}
    conversations = [Conversation(router, unique("c")) for _ in range(SESSIONS)]
    run_turns(conversations, range(TURNS))
    while len({c.nodes[0] for c in conversations}) < 3 and len(conversations) < 4 * SESSIONS:
        # new keys go to the node with the fewest (min_group): all three get some; more sessions, were one missed
        conversations.append(Conversation(router, unique("c")))
        run_turns(conversations[-1:], range(TURNS))
    home = {}
    for conversation in conversations:
        assert len(set(conversation.nodes)) == 1, (conversation.name, conversation.nodes)
        home[conversation.name] = conversation.nodes[0]
    assert len(set(home.values())) == 3, "the sessions should spread over all three nodes"
    for conversation in conversations:  # every completed turn committed and published, and the proxy knows it
        seen = by_url[home[conversation.name]].inspect(conversation.name)
        assert seen["native"]["published_version"] == TURNS and seen["committed_messages"] == 2 * TURNS and seen["history_known"]

    lost = nodes[0]
    orphans = [c for c in conversations if home[c.name] == lost.url]
    assert orphans, "node0 serves no session; choose more sessions"
    assert all(stored_version(store, c.name) == TURNS for c in conversations)

    def talk(conversation: Conversation) -> list[int]:
        return [status for t in ("During the loss", "After the loss") for status in conversation.turn_when_possible(f"{t}, {conversation.name}.")[1]]

    with ThreadPoolExecutor(4) as pool:  # two more turns each; node0 dies while the first ones run
        running = [pool.submit(talk, c) for c in conversations]
        deadline = time.monotonic() + WAIT
        while not any(len(c.nodes) > TURNS for c in conversations):  # the round is under way
            assert time.monotonic() < deadline
            time.sleep(0.02)
        lost.kill()
        refusals = dict(zip((c.name for c in conversations), (future.result() for future in running)))
    for conversation in conversations:
        node = conversation.nodes[-1]
        if conversation in orphans:
            assert node != lost.url
        else:
            assert set(conversation.nodes) == {home[conversation.name]} and not refusals[conversation.name], "a session of a surviving node moved"
        seen = by_url[node].inspect(conversation.name)  # waits for the last turn's commit, behind its answer
        latest = stored_version(store, conversation.name)  # so read only now
        # the node serves the latest published version (none lost); every answered turn is in memory once
        # (one answered just before the kill, not yet committed, is committed with the next), the history still trimmed
        assert seen["native"]["published_version"] == latest and TURNS + 1 <= latest <= TURNS + 2, seen
        assert seen["history_known"] and seen["committed_messages"] == 2 * (TURNS + 2), seen
        # trimmed: the proxy sent only the new message (and the turn answered just before the kill, if any)
        assert trimmed(proxy_chat_format, conversation, uncommitted=(0, 2)), conversation.prompts[-1]
    before = {c.name: stored_version(store, c.name) for c in orphans}
    moved = {c.name: c.nodes[-1] for c in orphans}

    lost.start()  # the same address: SMG's health check brings it back into the ring
    router.wait_healthy({node.url for node in nodes})
    for conversation in conversations:
        if conversation in orphans:
            # routed home again; its taker lets it go once idle there (lease released, then unloaded: refused
            # with 409 naming the owner until then), and it continues at home from the store, trimmed
            node, refused = conversation.turn_when_possible("Home again?")
            assert node == lost.url != moved[conversation.name] and set(refused) <= {409}, refused
            seen = lost.inspect(conversation.name)  # waits for the turn's commit, behind its answer
            assert seen["native"]["published_version"] == before[conversation.name] + 1 == stored_version(store, conversation.name), seen
            assert seen["history_known"] and trimmed(proxy_chat_format, conversation), conversation.prompts[-1]
        else:
            assert conversation.turn("Still here?") == home[conversation.name]


def test_a_drained_node_hands_its_sessions_off(cluster, proxy_chat_format):
    """POST /admin/drain: the node answers not-ready, SMG stops routing to it and its core unloads its sessions
    (ownership given up, memory kept in the store): they continue on the others at once, from their published
    memory, trimmed, while the drained node's core still runs."""
    router, nodes, store = cluster
    by_url = {node.url: node for node in nodes}
    conversations = [Conversation(router, unique("d")) for _ in range(9)]
    run_turns(conversations, range(2))
    leaving = by_url[conversations[0].nodes[0]]
    theirs = [c for c in conversations if c.nodes[0] == leaving.url]

    drained = httpx.post(leaving.url + "/admin/drain", timeout=150)
    assert drained.status_code == 200 and drained.json()["drained"], drained.text
    # every state the node holds is handed off: its sessions' (a named session also keeps the state before its turn)
    assert drained.json()["handed_off"] == drained.json()["sessions"] >= len(theirs), drained.text
    assert httpx.get(leaving.url + "/health/ready").status_code == 503
    refused = httpx.post(leaving.url + "/v1/chat/completions", json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    router.wait_healthy({node.url for node in nodes} - {leaving.url})

    for conversation in theirs:  # no waiting for ownership leases to lapse: the drain gave them up
        node = conversation.turn("After the drain.")
        assert node != leaving.url
        seen = by_url[node].inspect(conversation.name)
        assert seen["native"]["published_version"] == 3 and seen["history_known"] and seen["committed_messages"] == 6, seen
        assert stored_version(store, conversation.name) == 3
        assert trimmed(proxy_chat_format, conversation)

    # undrain: the node takes requests again, the router's health check re-admits it
    assert httpx.post(leaving.url + "/admin/undrain", timeout=30).json() == {"draining": False}
    assert httpx.get(leaving.url + "/health/ready").status_code == 200
    router.wait_healthy({node.url for node in nodes})
    again = httpx.post(leaving.url + "/v1/chat/completions", json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, timeout=120)
    assert again.status_code == 200, again.text


def test_the_routing_key_is_the_session_and_may_not_contradict_it(cluster):
    """Behind SMG the session arrives as X-SMG-Routing-Key; a request naming two different sessions is refused."""
    router, nodes, _ = cluster
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = httpx.post(nodes[0].url + "/v1/chat/completions", json=body, headers={"X-SMG-Routing-Key": "a", "X-MemT-Session": "b"}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "X-SMG-Routing-Key"
    name = unique("k")
    response = httpx.post(router.url + "/v1/chat/completions", json=body, headers={"X-SMG-Routing-Key": name}, timeout=60)
    assert response.status_code == 200, response.text
    node = {n.url: n for n in nodes}[response.headers[ROUTED]]
    assert node.inspect(name)["session"] == name  # the request ran on that session
    stream = httpx.post(router.url + "/v1/chat/completions", json={**body, "stream": True}, headers={"X-SMG-Routing-Key": name}, timeout=60)
    assert stream.status_code == 200 and stream.headers[ROUTED] == node.url
    assert stream.text.rstrip().endswith("data: [DONE]")


@pytest.fixture
def pair(redis_url, tmp_path):  # noqa: F811  (redis_url is the fixture)
    """Two nodes of the demo model on one store, one Redis and one records directory (no router)."""
    from e2e.proxies import DEMO_PATH

    nodes = [Node(f"node{i}", DEMO_PATH, tmp_path / "store", tmp_path / "records", redis_url) for i in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(Node.start, nodes))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def test_responses_chains_and_conversations_continue_on_another_node(pair):
    """Stored responses and conversations live in the shared records directory: after a drain of the node that
    served them, another node reads them, continues the chain and the conversation from their memory (the
    prompt holds only the new input), and lists the conversation's items."""
    from openai import OpenAI

    from e2e.proxies import DEMO_MODEL

    first, second = (OpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=120) for node in pair)

    def create(client, **kwargs):
        return client.responses.create(model=DEMO_MODEL, max_output_tokens=32, **kwargs)

    told = create(first, input="My name is Ann.")
    chained = create(first, input="I live in Oslo.", previous_response_id=told.id)
    conversation = first.conversations.create()
    create(first, input="My name is Bo.", conversation=conversation.id)
    drained = httpx.post(pair[0].url + "/admin/drain", timeout=150)
    assert drained.status_code == 200 and drained.json()["handed_off"] == 2, drained.text

    question = "Where do I live?"
    alone = create(second, input=question, store=False)  # the tokens of the question alone
    assert second.responses.retrieve(chained.id).output_text == chained.output_text
    continued = create(second, input=question, previous_response_id=chained.id)
    assert continued.usage.input_tokens == alone.usage.input_tokens  # the chain's turns came from memory
    again = create(second, input=question, conversation=conversation.id)
    assert again.usage.input_tokens == alone.usage.input_tokens
    items = [item.content[0].text for item in second.conversations.items.list(conversation.id) if item.type == "message"]
    assert items[0] == "My name is Bo." and items[-2] == question and len(items) == 4, items


def test_admin_routes_find_a_session_its_core_let_go_or_another_node_served(pair):
    """A session the core unloaded for idleness (its memory in the store) is still inspected on its node, and
    on a node that never served it (shared records): both bring it back from the store at its version."""
    from openai import OpenAI

    from e2e.proxies import DEMO_MODEL

    served, other = pair
    session = unique("admin")
    client = OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=120, default_headers={"X-MemT-Session": session})
    reply = client.chat.completions.create(model=DEMO_MODEL, messages=[{"role": "user", "content": "My name is Ann."}], max_tokens=32)
    assert reply.choices[0].finish_reason == "stop"
    assert served.inspect(session)["native"]["published_version"] == 1  # waits for the commit behind the answer
    native = native_session_id("default", session)
    served.core.wait_unloaded(native, timeout=WAIT)  # lease released after --lease-idle, unloaded after --unload-idle
    seen = served.inspect(session)
    assert seen["native"]["published_version"] == 1 and seen["history_known"] and seen["committed_messages"] == 2, seen
    assert httpx.delete(f"{other.url}/v1/memt/sessions/{unique('never')}", timeout=60).status_code == 404
    served.core.wait_unloaded(native, timeout=WAIT)  # again (the inspect brought it back), then looked up on the other node
    seen = other.inspect(session)
    assert seen["native"]["published_version"] == 1 and seen["history_known"] and seen["committed_messages"] == 2, seen


def test_the_cluster_script_stops_saying_why_when_a_node_cannot_listen(nano_checkpoint, tmp_path):
    """``scripts/start_cluster.sh``: a core that exits at start (its port taken) stops the whole cluster at
    once with a non-zero status and the end of that core's log, instead of polling it for minutes."""
    redis_server_binary()
    smg_binary()
    ports = cluster_script_ports(2)
    core0, proxy0, redis = (int(ports[name]) for name in ("MEMT_CORE_PORT", "MEMT_PROXY_PORT", "MEMT_REDIS_PORT"))
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind((HOST, core0 + 1))
    taken.listen()
    env = {**os.environ, **ports, "MEMT_PYTHON": sys.executable, "MEMT_CLUSTER_DIR": str(tmp_path),
           "MEMT_CLUSTER_PORT": str(free_port())}
    try:
        done = subprocess.run(["bash", "scripts/start_cluster.sh", "2", str(nano_checkpoint)], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=280)  # under the script's own 300 s wait
    finally:
        taken.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "core 1 exited before it was ready" in done.stderr, done.stderr
    assert "Address already in use" in done.stderr and "stopping the cluster" in done.stdout, done.stdout + done.stderr
    assert not any(process_listens(port) for port in (core0, proxy0, redis))  # what it started is gone


def process_listens(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((HOST, port)) == 0


@pytest.mark.parametrize("nodes", ["0", "two", "-1"])
def test_the_cluster_script_refuses_a_node_count_that_is_not_a_positive_integer(nodes, tmp_path):
    done = subprocess.run(["bash", "scripts/start_cluster.sh", nodes], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MEMT_PYTHON": sys.executable, "MEMT_CLUSTER_DIR": str(tmp_path)})
    assert done.returncode == 2 and f"the number of nodes must be a positive integer, got '{nodes}'" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())  # nothing was started or written


def test_a_headerless_conversation_continues_from_memory_on_another_node(pair):
    """Header-less memory across nodes (issue 37): a conversation kept on one node (its states recorded by head
    in the shared records, their memory in the shared store once that core lets them go) resumes from that
    memory on the other node, which finds the deepest state by the transcript alone: the one forked behind the
    third answer, so the prompt holds only the new message."""
    from openai import OpenAI

    from e2e.proxies import DEMO_MODEL, demo_chat_format

    served, other = pair
    clients = [OpenAI(base_url=node.url + "/v1", api_key="none", max_retries=0, timeout=120) for node in pair]
    history: list[dict] = []

    def turn(client, text: str):
        history.append({"role": "user", "content": text})
        response = client.chat.completions.create(model=DEMO_MODEL, messages=history, temperature=0.0, max_tokens=24)
        history.append({"role": "assistant", "content": response.choices[0].message.content})
        return response

    for text in ("Hi, my name is Ottilie.", "How are you?", "Tell me something."):
        turn(clients[0], text)
    records = served.proxy_args[served.proxy_args.index("--records-directory") + 1]
    deadline = time.monotonic() + WAIT
    while True:  # the third turn's commit behind its answer has reached the shared records
        # the count first: a state is recorded before its write, so the records read after it hold both states
        written = httpx.get(served.url + "/metrics", timeout=10).text.count("memt_proxy_memory_writes_total 2.0")
        branches = [json.loads(path.read_text()) for path in (Path(records) / "branches").glob("*.json")]
        if written and any(b["head"] is not None for b in branches):
            break
        assert time.monotonic() < deadline, branches
        time.sleep(0.05)
    # turn 2 kept a state of turns 1-2; turn 3 read it and forked the next behind its answer (turns 1-3)
    assert len(branches) == 2, branches
    for branch in branches:
        served.core.wait_unloaded(native_session_id("default", branch["name"]), timeout=WAIT)
    response = turn(clients[1], "What is my name?")
    assert response.usage.prompt_tokens == len(expected_prompt(demo_chat_format(), history[:-1], 6))


def test_headerless_conversations_through_the_router(cluster, proxy_chat_format):
    """Header-less memory behind SMG (issues 37, 49), no header of any kind: the router sends each turn to the node
    whose past requests share the longest prefix with it, the node that keeps the conversation's state, so from
    turn 3 on a turn reads only its new message; conversations spread over the nodes. Issue 49's targets: >= 95 %
    of turns 3+ from memory, no node over 1.5x the mean of conversations (asserted with a margin for a loaded
    machine; the figures are printed)."""
    router, nodes, _ = cluster
    conversations = [Conversation(router, unique("h"), routing_key=False) for _ in range(12)]

    def talk(conversation: Conversation) -> None:
        for t in range(6):  # each opens with its own name: conversations that open alike share a prefix
            conversation.turn(f"{conversation.name} says: turn {t}.")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(talk, conversations))
    from_memory = 0
    for conversation in conversations:
        for sent, prompt_tokens in conversation.prompts[2:]:
            assert prompt_tokens <= len(expected_prompt(proxy_chat_format, sent, None))  # wherever it ran
            from_memory += prompt_tokens == len(expected_prompt(proxy_chat_format, sent, len(sent) - 1))  # only the new message
    later = 4 * len(conversations)
    homes = [max(set(c.nodes), key=c.nodes.count) for c in conversations]
    per_node = [homes.count(node.url) for node in nodes]
    print(f"header-less through SMG: {from_memory} of {later} turns 3-6 from memory; conversations per node {per_node}")
    assert from_memory >= 0.9 * later, (from_memory, [c.nodes for c in conversations])
    assert max(per_node) <= 1.5 * len(conversations) / len(nodes), per_node


def test_per_request_controls_reach_the_proxy_through_the_router_in_the_body_metadata(cluster, proxy_chat_format):
    """SMG forwards X-SMG-Routing-Key but not X-MemT-Memory: behind it the memory policy travels in the body's
    ``metadata`` (``memt_memory``), which SMG keeps. A stateless request through the router reads the whole
    transcript on the very node that keeps the session, and leaves the session's memory as it was; the header
    alone is dropped on the way (the turn is served from memory and committed)."""
    router, nodes, _ = cluster
    by_url = {node.url: node for node in nodes}
    named = Conversation(router, unique("m"))
    home = {named.turn("My name is Ann."), named.turn("I live in Oslo.")}
    assert len(home) == 1
    node = by_url[home.pop()]
    assert node.inspect(named.name)["committed_messages"] == 4
    whole = len(expected_prompt(proxy_chat_format, [*named.messages, {"role": "user", "content": "Where do I live?"}], None))

    sent = [*named.messages, {"role": "user", "content": "Where do I live?"}]
    raw = named.client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=sent, max_tokens=24, stop=STOPS,
                                                                 metadata={"memt_memory": "off"})
    assert raw.headers[ROUTED] == node.url and raw.parse().usage.prompt_tokens == whole  # stateless, on the session's node
    seen = node.inspect(named.name)
    assert seen["committed_messages"] == 4 and seen["native"]["published_version"] == 2, seen  # nothing committed

    assert named.turn("Where do I live?", extra_headers={"X-MemT-Memory": "off"}) == node.url  # the header does not get through:
    assert named.prompts[-1][1] == len(expected_prompt(proxy_chat_format, named.prompts[-1][0], 4)) < whole  # from memory
    assert node.inspect(named.name)["committed_messages"] == 6  # and committed

    headerless = Conversation(router, unique("s"), routing_key=False)
    for t in range(3):
        headerless.turn(f"{headerless.name} says: turn {t}.")
    sent = [*headerless.messages, {"role": "user", "content": "And now?"}]
    stateless = headerless.client.chat.completions.create(model=MODEL_NAME, messages=sent, max_tokens=24, stop=STOPS, metadata={"memt_memory": "off"})
    assert stateless.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, sent, None))


def test_the_cluster_script_routes_as_the_tests_do():
    """``scripts/start_cluster.sh`` starts SMG with ``memt_proxy.http.cluster.SMG_ROUTING``, the routing these tests run."""
    script = (REPO_ROOT / "scripts" / "start_cluster.sh").read_text()
    assert f"ROUTING=({' '.join(SMG_ROUTING)})" in script and '"${ROUTING[@]}" --worker-urls' in script
