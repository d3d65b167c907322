"""memt-http-v1 over HTTP against a live Nano server: every control action, every documented error
status, identity/capabilities, metrics, SSE streaming, stop conditions, ordinary generation, leases.

All tests share one server (``nano_server``) and use their own session IDs.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
from e2e.wire import Handle, Wire, assert_error, metric, nonce, parse_frames, sse_frames, unique

pytestmark = pytest.mark.timeout(300)

PROMPT = [17, 42, 99, 123, 7]
TURN = list(range(20, 60))  # 40 tokens: two write events of chunk_tokens 32
OTHER_TURN = list(range(200, 230))


@pytest.fixture(scope="module")
def http(nano_server):
    with nano_server.client() as client:
        yield client


@pytest.fixture
def wire(http):
    wire = Wire(http)
    yield wire
    wire.close_all()  # sessions a failed test left open (close of closed sessions is a harmless 409)


def inspect(wire: Wire, session: str) -> dict:
    return wire.control("inspect", session)


# ---------------------------------------------------------------------- identity, capabilities, health


def test_health_identity_capabilities(http, nano_checkpoint):
    assert http.get("/health").json() == {"status": "ok"}
    identity = http.get("/memt/identity").json()
    assert identity["model"] == "memt-nano"
    assert identity["extra"]["model_type"] == "memt_qwen3_5_moe" and identity["sglang_version"] is None
    assert identity["config_sha256"] == hashlib.sha256((nano_checkpoint / "config.json").read_bytes()).hexdigest()
    assert identity["checkpoint_id"] == "tiny-random-nano"
    assert identity["memt_runtime"] == {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256}
    assert identity["extra"]["engine"] == "memt-torch" and identity["extra"]["engine_version"]
    caps = http.get("/memt/capabilities").json()
    assert caps["protocol"] == "memt-http-v1"
    assert caps["snapshot_format"] == "memt-memory-v1"
    assert isinstance(caps["epoch"], str) and len(caps["epoch"]) >= 16
    assert caps["chunk_tokens"] == 32
    assert caps["max_prefill_tokens"] == 16384
    assert caps["streaming"]["format"] == "sse" and caps["streaming"]["text"] == "cumulative"
    assert caps["streaming"]["done"] == "data: [DONE]"
    assert caps["retain_kv"] is False
    assert caps["native_encoding"] == "hf-chat-template"
    assert caps["identity"] == identity["extra"]["identity"]
    assert http.get("/memt/capabilities").json()["epoch"] == caps["epoch"]  # stable while the process lives


# ---------------------------------------------------------------------- every control action


def test_control_actions_success_paths(wire, nano_server):
    # create: default read policy, explicit memory_read false, server-chosen ID
    created = wire.control("create", unique())
    assert created["memory_read"] is True and created["retain_kv"] is False and created["epoch"] == wire.epoch
    unread = wire.control("create", unique(), memory_read=False)["session"]
    assert inspect(wire, unread)["memory_read"] is False
    auto = wire.control("create")["session"]
    assert auto and inspect(wire, auto)["leased"] is False
    for other in (unread, auto):
        wire.opened.append(Handle(other, wire.control("acquire", other)["lease"]))  # closed at teardown

    # acquire / renew / inspect
    s = created["session"]
    acquired = wire.control("acquire", s)
    assert acquired["ttl"] == 300 and acquired["lease"]
    h = Handle(s, acquired["lease"])
    assert wire.ctl("renew", h, ttl=60) == {"session": s, "lease": h.lease, "ttl": 60}
    info = inspect(wire, s)
    assert info["leased"] is True and 0 < info["lease_expires_in"] <= 60 and info["published_version"] == 0

    empty_answer = wire.query(h, PROMPT, 10)["output_ids"]

    # begin → commit → export candidate → abort: published memory untouched
    wire.ctl("begin", h, transaction="t-aborted")
    landed = wire.commit(h, "t-aborted", OTHER_TURN)
    assert landed["meta_info"]["memt"] == {
        "session": s, "transaction": "t-aborted", "nonce": landed["meta_info"]["memt"]["nonce"],
        "committed_tokens": len(OTHER_TURN), "write_events": 1, "status": "applied",
    }
    assert landed["output_ids"] == [] and landed["meta_info"]["completion_tokens"] == 0
    candidate_file = f"{s}-candidate.safetensors"
    assert wire.export(h, candidate_file, transaction="t-aborted")["file"] == candidate_file
    assert wire.ctl("abort", h, transaction="t-aborted")["state"] == "aborted"
    assert inspect(wire, s)["published_version"] == 0
    assert wire.query(h, PROMPT, 10)["output_ids"] == empty_answer

    # begin → two commits → publish (turning reading off) → memory_read on again
    wire.ctl("begin", h, transaction="t1")
    first = wire.commit(h, "t1", TURN)["meta_info"]["memt"]
    assert first["write_events"] == 2 and first["committed_tokens"] == 40
    wire.commit(h, "t1", OTHER_TURN)
    published = wire.ctl("publish", h, transaction="t1", memory_read=False)
    assert published == {"session": s, "transaction": "t1", "state": "published", "memory_read": False, "commits": 2}
    assert wire.query(h, PROMPT, 10)["output_ids"] == empty_answer  # not reading
    assert wire.ctl("memory_read", h, enabled=True) == {"session": s, "memory_read": True}
    with_memory = wire.query(h, PROMPT, 10)["output_ids"]
    assert with_memory != empty_answer, "the committed memory should change this greedy answer"
    assert inspect(wire, s)["published_version"] == 1

    # status: the receipts of both transactions
    status = wire.ctl("status", h)
    assert status["transaction"] is None and status["uncertain"] is False and status["in_flight"] == []
    receipts = status["receipts"]
    assert receipts["t-aborted"]["state"] == "aborted"
    assert [c["status"] for c in receipts["t-aborted"]["commits"]] == ["applied"]
    assert receipts["t1"]["state"] == "published"
    assert [(c["tokens"], c["status"]) for c in receipts["t1"]["commits"]] == [(40, "applied"), (30, "applied")]

    # export: published memory under a chosen name and under a server-chosen name
    named = wire.export(h, f"{s}.safetensors")
    assert named == {"session": s, "file": f"{s}.safetensors", "transaction": None, "encoding": "hf-chat-template"}
    chosen = wire.export(h)["file"]
    assert chosen.endswith(".safetensors") and chosen != named["file"]
    for file in (named["file"], chosen, candidate_file):
        assert (nano_server.state_directory / file).is_file()

    # create with source + source_lease copies published memory
    copy = wire.control("create", unique("copy"), source=s, source_lease=h.lease)
    assert copy["source"] == s
    copy_lease = wire.control("acquire", copy["session"])["lease"]
    hc = Handle(copy["session"], copy_lease)
    assert wire.query(hc, PROMPT, 10)["output_ids"] == with_memory

    # import into a transaction, publish → same answers; importing the aborted candidate differs
    hi = wire.open()
    wire.ctl("begin", hi, transaction="restore")
    imported = wire.ctl("import", hi, transaction="restore", file=named["file"], encoding=wire.encoding)
    assert imported == {"session": hi.session, "transaction": "restore", "file": named["file"], "state": "open"}
    assert wire.ctl("status", hi)["receipts"]["restore"]["imported"] == named["file"]
    wire.ctl("publish", hi, transaction="restore")
    assert wire.query(hi, PROMPT, 10)["output_ids"] == with_memory
    hx = wire.open()
    wire.ctl("begin", hx, transaction="cand")
    wire.ctl("import", hx, transaction="cand", file=candidate_file, encoding=wire.encoding)
    wire.ctl("publish", hx, transaction="cand")
    reference = wire.open()  # the exported candidate is exactly the aborted transaction's memory
    wire.write(reference, OTHER_TURN)
    assert wire.query(hx, PROMPT, 10)["output_ids"] == wire.query(reference, PROMPT, 10)["output_ids"] != with_memory

    # recover (nothing uncertain) renews the lease; cancel of an unknown request is a no-op
    recovered = wire.ctl("recover", h, ttl=120)
    assert recovered["recovered"] is True and recovered["lease"] == h.lease and recovered["ttl"] == 120
    rid = f"memt|{s}|query|{nonce()}"
    assert wire.ctl("cancel", h, request_id=rid) == {"session": s, "request_id": rid, "cancelled": False}

    # reset clears memory (answers as empty again); release; close
    reset = wire.ctl("reset", h)
    assert reset == {"session": s, "reset": True, "aborted_transaction": None}
    assert wire.query(h, PROMPT, 10)["output_ids"] == empty_answer
    assert wire.ctl("release", h) == {"session": s, "released": True, "abandoned_transaction": None,
                                       "cancelled_requests": [], "pending_commits": [], "reconciled": False}
    assert inspect(wire, s)["leased"] is False
    h2 = Handle(s, wire.control("acquire", s)["lease"])
    assert wire.ctl("close", h2) == {"session": s, "closed": True}
    wire.control("inspect", s, expect=409)
    for handle in (hc, hi, hx, reference):
        wire.ctl("close", handle)


# ---------------------------------------------------------------------- 400: bad control requests


@pytest.fixture(scope="module")
def leased(http):
    """One leased session for the error tests, with no memory and no transaction."""
    wire = Wire(http)
    handle = wire.open()
    yield handle
    wire.ctl("close", handle)


RAW_BAD_BODIES = {
    "malformed JSON": b'{"action": "inspect",',
    "not UTF-8": b"\xff\xfe\xfd",
    "empty body": b"",
    "deeply nested": b"[" * 100_000,
    "integer beyond the parser's digit limit": b'{"input_ids": [' + b"9" * 5000 + b"]}",
    "NaN values": b'{"action": "acquire", "session": "s", "ttl": NaN, "input_ids": [NaN], "sampling_params": {"max_new_tokens": 1, "temperature": NaN}}',
    "Infinity values": b'{"action": "acquire", "session": "s", "ttl": Infinity, "input_ids": [1], "sampling_params": {"max_new_tokens": Infinity}}',
}


def _bad_control_bodies(epoch: str, s: str, lease: str) -> dict[str, object]:
    base = {"session": s, "lease": lease, "epoch": epoch}
    return {
        "body is a list": [{"action": "inspect", "session": s}],
        "body is a string": "inspect",
        "missing action": {"session": s},
        "unknown action": {"action": "frobnicate", "session": s},
        "action not a string": {"action": 5, "session": s},
        "session with slash": {"action": "inspect", "session": "a/b"},
        "session with dots and slash": {"action": "create", "session": "../x"},
        "empty session": {"action": "inspect", "session": ""},
        "session too long": {"action": "create", "session": "x" * 161},
        "session with space": {"action": "create", "session": "a b"},
        "session not a string": {"action": "inspect", "session": 5},
        "session missing": {"action": "acquire"},
        "ttl zero": {"action": "acquire", "session": s, "ttl": 0},
        "ttl too long": {"action": "renew", **base, "ttl": 3601},
        "ttl a string": {"action": "renew", **base, "ttl": "10"},
        "ttl a bool": {"action": "renew", **base, "ttl": True},
        "ttl a float": {"action": "renew", **base, "ttl": 1.5},
        "unknown field": {"action": "inspect", "session": s, "colour": "blue"},
        "lease missing": {"action": "begin", "session": s, "epoch": epoch, "transaction": "t"},
        "lease not a string": {"action": "begin", "session": s, "lease": 5, "transaction": "t"},
        "epoch not a string": {"action": "inspect", "session": s, "epoch": 5},
        "transaction missing": {"action": "begin", **base},
        "transaction bad name": {"action": "begin", **base, "transaction": "t/1"},
        "memory_read without enabled": {"action": "memory_read", **base},
        "enabled not a bool": {"action": "memory_read", **base, "enabled": "yes"},
        "create memory_read not a bool": {"action": "create", "memory_read": 1},
        "export without encoding": {"action": "export", **base},
        "export wrong encoding": {"action": "export", **base, "encoding": "encoding_dsv4"},
        "export overwrite not a bool": {"action": "export", **base, "encoding": "hf-chat-template", "overwrite": "yes"},
        "import without file": {"action": "import", **base, "transaction": "t", "encoding": "hf-chat-template"},
        "cancel without request_id": {"action": "cancel", **base},
        "source_lease without source": {"action": "create", "session": unique(), "source_lease": lease},
        "retain_kv without streaming sessions": {"action": "create", "session": unique(), "retain_kv": True},
        "kv_reset on a session without retain_kv": {"action": "kv_reset", **base},
    }


def test_bad_control_requests_get_400_and_change_nothing(wire, leased):
    before = inspect(wire, leased.session)
    sessions_before = metric(wire.http.get("/metrics").text, "memt_sessions")
    failures = []
    for name, body in _bad_control_bodies(wire.epoch, leased.session, leased.lease).items():
        response = wire.post_control(body)
        try:
            assert_error(response, 400)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    for name, raw in {**RAW_BAD_BODIES, "not UTF-8 in a string": b'{"action": "\xff\xfe"}'}.items():
        response = wire.http.post("/memt/control", content=raw, headers={"content-type": "application/json"})
        try:
            assert_error(response, 400)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)
    after = inspect(wire, leased.session)
    assert {k: v for k, v in after.items() if k != "lease_expires_in"} == {k: v for k, v in before.items() if k != "lease_expires_in"}
    assert metric(wire.http.get("/metrics").text, "memt_sessions") == sessions_before


# ---------------------------------------------------------------------- 400: bad generation requests


def _bad_generate_bodies(wire: Wire, h: Handle, txn: str) -> dict[str, object]:
    commit = wire.commit_body(h, txn, [5, 6, 7], "reusable-nonce")
    query = wire.query_body(h, [5, 6, 7], 4, nonce_="reusable-nonce")
    vocab = 10**6
    return {
        "body is a list (batch)": [query, query],
        "missing input_ids": {k: v for k, v in query.items() if k != "input_ids"},
        "empty input_ids": {**query, "input_ids": []},
        "batched input_ids": {**query, "input_ids": [[5, 6], [7, 8]]},
        "negative token": {**query, "input_ids": [5, -1]},
        "token beyond the vocabulary": {**query, "input_ids": [5, vocab]},
        "token as string": {**query, "input_ids": [5, "6"]},
        "token as bool": {**query, "input_ids": [5, True]},
        "token as float": {**query, "input_ids": [5, 6.0]},
        "input_ids not a list": {**query, "input_ids": "5 6 7"},
        "text on a MemT query": {**query, "text": "hello"},
        "text instead of input_ids": {**{k: v for k, v in query.items() if k != "input_ids"}, "text": "hello"},
        "input_embeds": {**query, "input_embeds": [[0.1, 0.2]]},
        "image_data": {**query, "image_data": "x.png"},
        "missing sampling_params": {k: v for k, v in query.items() if k != "sampling_params"},
        "missing max_new_tokens": {**query, "sampling_params": {"temperature": 0}},
        "negative max_new_tokens": {**query, "sampling_params": {"max_new_tokens": -1}},
        "string max_new_tokens": {**query, "sampling_params": {"max_new_tokens": "8"}},
        "float max_new_tokens": {**query, "sampling_params": {"max_new_tokens": 8.0}},
        "n = 2": {**query, "sampling_params": {"max_new_tokens": 4, "n": 2}},
        "ignore_eos": {**query, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
        "negative temperature": {**query, "sampling_params": {"max_new_tokens": 4, "temperature": -1}},
        "top_p zero": {**query, "sampling_params": {"max_new_tokens": 4, "top_p": 0}},
        "top_k zero": {**query, "sampling_params": {"max_new_tokens": 4, "top_k": 0}},
        "unknown sampling field": {**query, "sampling_params": {"max_new_tokens": 4, "beam_width": 3}},
        "stop_token_ids not ids": {**query, "sampling_params": {"max_new_tokens": 4, "stop_token_ids": ["x"]}},
        "empty stop string": {**query, "sampling_params": {"max_new_tokens": 4, "stop": [""]}},
        "sampling_params not an object": {**query, "sampling_params": [4]},
        "prompt beyond max_prefill_tokens": {**query, "input_ids": [5] * 16385},
        "prompt + max_new_tokens beyond the context": {**query, "sampling_params": {"max_new_tokens": 8190}},
        "stream not a bool": {**query, "stream": "yes"},
        "unknown top-level field": {**query, "temperature": 0},
        "lora_path": {**query, "lora_path": "adapter"},
        "missing memt_lease": {k: v for k, v in query.items() if k != "memt_lease"},
        "memt_epoch not a string": {**query, "memt_epoch": 7},
        "query naming a transaction": {**query, "memt_transaction": txn},
        "session_params without retain_kv": {**query, "session_params": {"id": h.session}},
        "session_params with another id": {**query, "session_params": {"id": "someone-else"}},
        "hidden states on a query": {**query, "return_hidden_states": True},
        "top_logprobs_num without return_logprob": {**query, "top_logprobs_num": 2},
        "commit count differs from input_ids": {**commit, "rid": f"memt|{h.session}|commit:4|n-count"},
        "commit with max_new_tokens 1": {**commit, "sampling_params": {"max_new_tokens": 1}},
        "commit without memt_transaction": {k: v for k, v in commit.items() if k != "memt_transaction"},
        "commit with bad transaction name": {**commit, "memt_transaction": "t 1"},
        "commit with stream": {**commit, "stream": True},
        "commit asking for logprobs": {**commit, "return_logprob": True},
        "commit asking for hidden states": {**commit, "return_hidden_states": True},
        "commit with session_params": {**commit, "session_params": {"id": h.session}},
        "rid with too few parts": {**query, "rid": f"memt|{h.session}|query"},
        "rid with too many parts": {**query, "rid": f"memt|{h.session}|query|n|x"},
        "rid with a bad prefix": {**query, "rid": f"memtx|{h.session}|query|n"},
        "rid 'memt' alone": {**query, "rid": "memt"},
        "rid with unknown operation": {**query, "rid": f"memt|{h.session}|fly|n"},
        "rid commit without count": {**commit, "rid": f"memt|{h.session}|commit|n"},
        "rid commit:0": {**commit, "rid": f"memt|{h.session}|commit:0|n", "input_ids": []},
        "rid commit:abc": {**commit, "rid": f"memt|{h.session}|commit:abc|n"},
        "rid commit:03": {**commit, "rid": f"memt|{h.session}|commit:03|n"},
        "rid with a bad session id": {**query, "rid": "memt|a/b|query|n"},
        "rid with a bad nonce": {**query, "rid": f"memt|{h.session}|query|a b"},
        "rid with an overlong nonce": {**query, "rid": f"memt|{h.session}|query|{'n' * 161}"},
        "rid not a string": {**query, "rid": 5},
        "rid list (batch)": {**query, "rid": ["a", "b"]},
        "plain: text and input_ids": {"text": "hi", "input_ids": [5], "sampling_params": {"max_new_tokens": 2}},
        "plain: neither text nor input_ids": {"sampling_params": {"max_new_tokens": 2}},
        "plain: text list (batch)": {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}},
        "plain: memt_lease without a MemT rid": {"input_ids": [5], "sampling_params": {"max_new_tokens": 2}, "memt_lease": h.lease},
        "plain: input_embeds": {"input_embeds": [[0.1]], "sampling_params": {"max_new_tokens": 2}},
        "plain: without max_new_tokens": {"input_ids": [5], "sampling_params": {}},
    }


def test_bad_generate_requests_get_400_and_change_nothing(wire, leased):
    txn = unique("t")
    wire.ctl("begin", leased, transaction=txn)
    failures = []
    for name, body in _bad_generate_bodies(wire, leased, txn).items():
        response = wire.post_generate(body)
        try:
            assert_error(response, 400)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    for name, raw in RAW_BAD_BODIES.items():
        try:
            assert_error(wire.http.post("/generate", content=raw, headers={"content-type": "application/json"}), 400)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)
    # nothing landed, and the nonce used by the refused bodies is still free
    assert wire.ctl("status", leased)["receipts"][txn]["commits"] == []
    assert wire.ctl("status", leased)["in_flight"] == []
    wire.commit(leased, txn, [5, 6, 7], nonce_="reusable-nonce")
    assert [c["nonce"] for c in wire.ctl("status", leased)["receipts"][txn]["commits"]] == ["reusable-nonce"]
    wire.ctl("abort", leased, transaction=txn)


def test_unknown_routes_and_methods_answer_the_error_shape(http):
    assert_error(http.get("/no/such/route"), 404)
    assert_error(http.get("/memt/control"), 405)
    assert_error(http.delete("/generate"), 405)


def test_disabled_admin_routes_answer_409(http):
    from memt_core.server.app import DISABLED_ROUTES

    assert "/flush_cache" in DISABLED_ROUTES
    for path in DISABLED_ROUTES:
        assert_error(http.post(path, json={}), 409, match="disabled")
        assert_error(http.get(path), 409, match="disabled")


# ---------------------------------------------------------------------- 409: conflicts


def test_conflicts_answer_409(wire, http):
    h = wire.open()
    s = h.session

    # session existence and identity
    wire.control("create", s, expect=409)
    wire.control("inspect", unique("missing"), expect=409)
    wire.control("acquire", unique("missing"), expect=409)
    # leases: a second acquire, a wrong lease, an old epoch
    assert_error(wire.post_control({"action": "acquire", "session": s}), 409, match="leased")
    wire.control("begin", s, lease="not-the-lease", transaction="t", expect=409)
    assert_error(wire.post_control({"action": "begin", "session": s, "lease": h.lease, "epoch": "0" * 32, "transaction": "t"}), 409, match="epoch")
    assert_error(wire.post_generate({**wire.query_body(h, PROMPT, 2), "memt_epoch": "0" * 32}), 409, match="epoch")
    assert_error(wire.post_generate({**wire.query_body(h, PROMPT, 2), "memt_lease": "forged"}), 409, match="lease")
    # transactions: none open, wrong name, a second one, a reused name
    wire.ctl("publish", h, transaction="t0", expect=409)
    wire.commit(h, "t0", [1, 2, 3], expect=409)
    wire.ctl("begin", h, transaction="t1")
    wire.ctl("begin", h, transaction="t2", expect=409)
    wire.ctl("abort", h, transaction="t2", expect=409)
    wire.ctl("publish", h, transaction="t2", expect=409)
    wire.commit(h, "t2", [1, 2, 3], expect=409)
    wire.ctl("export", h, transaction="t2", encoding=wire.encoding, expect=409)
    # nonces: a reused nonce is refused and not applied twice
    wire.commit(h, "t1", [1, 2, 3], nonce_="once")
    wire.commit(h, "t1", [1, 2, 3], nonce_="once", expect=409)
    assert_error(wire.post_generate(wire.query_body(h, PROMPT, 2, nonce_="once")), 409, match="nonce")
    assert len(wire.ctl("status", h)["receipts"]["t1"]["commits"]) == 1
    wire.ctl("publish", h, transaction="t1")
    wire.ctl("begin", h, transaction="t1", expect=409)  # a transaction name is used once per session
    # export onto an existing file without overwrite
    file = f"{s}.safetensors"
    wire.export(h, file)
    wire.ctl("export", h, file=file, encoding=wire.encoding, expect=409)
    # a released lease is dead
    wire.ctl("release", h)
    wire.ctl("begin", h, transaction="t3", expect=409)
    wire.query(h, PROMPT, 2, expect=409)
    h.lease = wire.control("acquire", s)["lease"]
    wire.ctl("close", h)
    wire.ctl("close", h, expect=409)


def streaming(server, body: dict) -> tuple[list[str], threading.Thread]:
    """Start a streaming query in a thread; returns once its first frame arrived (the query is running)."""
    frames: list[str] = []
    started = threading.Event()

    def stream():
        with server.client() as client, client.stream("POST", "/generate", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    frames.append(line[5:].strip())
                    started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(120), "no first frame"
    return frames, reader


def test_busy_session_answers_409_while_a_query_runs(wire, http, nano_server):
    h = wire.open()
    body = wire.query_body(h, PROMPT, 4000, stream=True)
    frames, reader = streaming(nano_server, body)
    try:
        assert inspect(wire, h.session)["in_flight"] == [body["rid"]]
        assert_error(wire.post_generate(wire.query_body(h, PROMPT, 2)), 409, match="in flight")
        wire.ctl("begin", h, transaction="t", expect=200)  # begin is allowed; publish is not
        wire.commit(h, "t", [1, 2, 3], expect=409)
        wire.ctl("publish", h, transaction="t", expect=409)
        wire.ctl("memory_read", h, enabled=False, expect=409)
        wire.ctl("reset", h, expect=409)
        wire.ctl("close", h, expect=409)
        cancelled = wire.ctl("cancel", h, request_id=body["rid"])
        assert cancelled == {"session": h.session, "request_id": body["rid"], "cancelled": True}
    finally:
        reader.join(120)
    # the stream ended with an abort frame and [DONE]; the session is idle again
    bodies = parse_frames(frames)
    assert bodies[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert all(b["meta_info"]["finish_reason"] is None for b in bodies[:-1])
    assert len(bodies[-1]["output_ids"]) < 4000
    assert inspect(wire, h.session)["in_flight"] == []
    wire.ctl("abort", h, transaction="t")
    wire.query(h, PROMPT, 2)
    wire.ctl("close", h)


def test_release_reconciles_a_running_query_and_an_open_transaction(wire, nano_server):
    """The spec's release: outstanding work is reconciled (the query cancelled, the transaction abandoned), then the lease goes."""
    h = wire.open()
    wire.ctl("begin", h, transaction="t")
    wire.commit(h, "t", [1, 2, 3])
    body = wire.query_body(h, PROMPT, 4000, stream=True)
    frames, reader = streaming(nano_server, body)
    try:
        released = wire.ctl("release", h)
    finally:
        reader.join(120)
    assert released["released"] is True and released["abandoned_transaction"] == "t"
    assert released["cancelled_requests"] == [body["rid"]] and released["pending_commits"] == []
    assert parse_frames(frames)[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert inspect(wire, h.session)["in_flight"] == [] and inspect(wire, h.session)["leased"] is False
    h.lease = wire.control("acquire", h.session)["lease"]
    receipt = wire.ctl("status", h)["receipts"]["t"]
    assert receipt["state"] == "abandoned" and [c["status"] for c in receipt["commits"]] == ["applied"]
    assert inspect(wire, h.session)["published_version"] == 0  # nothing of the abandoned transaction was published
    wire.ctl("close", h)


def test_cancel_a_non_streaming_query_by_rid(wire, nano_server):
    h = wire.open()
    body = wire.query_body(h, PROMPT, 4000)
    result = {}

    def run():
        with nano_server.client() as client:
            result["response"] = client.post("/generate", json=body)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while body["rid"] not in inspect(wire, h.session)["in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert wire.ctl("cancel", h, request_id=body["rid"])["cancelled"] is True
    worker.join(120)
    response = result["response"]
    assert response.status_code == 200
    assert response.json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert response.json()["meta_info"]["completion_tokens"] < 4000
    wire.ctl("close", h)


# ---------------------------------------------------------------------- leases between clients


def test_lease_expires_after_its_ttl(wire, nano_server):
    h = wire.open()
    wire.ctl("begin", h, transaction="t")
    assert wire.ctl("renew", h, ttl=1)["ttl"] == 1  # the shortest lease; it lapses during the sleep
    idle = wire.control("create", unique())["session"]
    assert wire.control("acquire", idle, ttl=1)["ttl"] == 1
    time.sleep(1.3)
    assert inspect(wire, h.session)["leased"] is False
    assert inspect(wire, idle)["leased"] is False
    wire.opened.append(Handle(idle, wire.control("acquire", idle)["lease"]))  # free to take again
    assert_error(wire.post_control({"action": "renew", "session": h.session, "lease": h.lease, "epoch": wire.epoch}), 409, match="expired")
    wire.commit(h, "t", [1, 2, 3], expect=409)
    wire.query(h, PROMPT, 2, expect=409)
    # another client takes the session over; the old lease stays dead
    with nano_server.client() as other_http:
        other = Wire(other_http)
        taken = other.control("acquire", h.session)
        assert taken["abandoned_transaction"] == "t"
        h2 = Handle(h.session, taken["lease"])
        wire.ctl("begin", h, transaction="t-old", expect=409)
        other.ctl("begin", h2, transaction="t-new")
        other.ctl("abort", h2, transaction="t-new")
        assert other.ctl("status", h2)["receipts"]["t"]["state"] == "abandoned"
        other.ctl("close", h2)


def test_second_client_cannot_act_on_a_leased_session(wire, nano_server):
    h = wire.open()
    wire.write(h, TURN)
    with nano_server.client() as other_http:
        other = Wire(other_http)
        other.control("acquire", h.session, expect=409)
        forged = Handle(h.session, "forged-lease")
        for action, fields in [
            ("renew", {}), ("release", {}), ("begin", {"transaction": "x"}), ("memory_read", {"enabled": False}),
            ("export", {"encoding": other.encoding}), ("status", {}), ("recover", {}), ("reset", {}), ("close", {}),
            ("cancel", {"request_id": "memt|x|query|y"}),
        ]:
            other.ctl(action, forged, expect=409, **fields)
        other.query(forged, PROMPT, 2, expect=409)
        other.control("create", unique(), source=h.session, source_lease="forged", expect=409)
        assert other.control("inspect", h.session)["leased"] is True  # inspect needs no lease
    assert inspect(wire, h.session)["published_version"] == 1
    wire.ctl("close", h)


# ---------------------------------------------------------------------- metrics


def test_metrics_expose_and_move(wire, http):
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    before = response.text
    for name in (
        "memt_sessions", "memt_leases", "memt_open_transactions", "memt_inflight_commits", "memt_commits_total",
        "memt_write_events_total", "memt_commit_tokens_total", "memt_prompt_tokens_total",
        "memt_generation_tokens_total", "memt_request_latency_seconds",
    ):
        assert f"# TYPE {name} " in before, name

    h = wire.open()
    wire.ctl("begin", h, transaction="t")
    middle = http.get("/metrics").text
    assert metric(middle, "memt_sessions") == metric(before, "memt_sessions") + 1
    assert metric(middle, "memt_leases") == metric(before, "memt_leases") + 1
    assert metric(middle, "memt_open_transactions") == metric(before, "memt_open_transactions") + 1
    wire.commit(h, "t", TURN)
    wire.ctl("publish", h, transaction="t")
    answer = wire.query(h, PROMPT, 6)
    plain = wire.plain(PROMPT, 3)
    wire.control("acquire", h.session, expect=409)
    after = http.get("/metrics").text

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("memt_commits_total") == 1
    assert delta("memt_commit_tokens_total") == len(TURN)
    assert delta("memt_write_events_total") == 2 * 2  # two write events on each of two memory layers
    assert delta("memt_prompt_tokens_total") == 2 * len(PROMPT)
    generated = answer["meta_info"]["completion_tokens"] + plain["meta_info"]["completion_tokens"]
    assert delta("memt_generation_tokens_total") == generated
    assert delta("memt_decode_steps_total") >= 1
    assert delta("memt_open_transactions") == 0
    assert delta("memt_request_latency_seconds_count", kind="commit") == 1
    assert delta("memt_request_latency_seconds_count", kind="query") == 1
    assert delta("memt_request_latency_seconds_count", kind="generate") == 1
    assert delta("memt_request_latency_seconds_sum", kind="commit") > 0
    assert delta("memt_control_requests_total", action="create", status="200") == 1
    assert delta("memt_control_requests_total", action="acquire", status="409") == 1
    assert delta("memt_generate_requests_total", kind="commit", status="200") == 1
    assert delta("memt_generate_requests_total", kind="query", status="200") == 1
    wire.ctl("close", h)
    assert metric(http.get("/metrics").text, "memt_sessions") == metric(before, "memt_sessions")


# ---------------------------------------------------------------------- streaming (SSE)


def test_stream_query_sse_format(wire, http):
    h = wire.open()
    wire.write(h, TURN)
    whole = wire.query(h, PROMPT, 12)
    status, frames = sse_frames(http, wire.query_body(h, PROMPT, 12, stream=True))
    assert status == 200
    bodies = parse_frames(frames)
    assert len(bodies) == len(whole["output_ids"])  # one frame per token
    for i, body in enumerate(bodies):
        assert body["output_ids"] == whole["output_ids"][: i + 1]  # cumulative
        assert body["meta_info"]["completion_tokens"] == i + 1
        assert body["meta_info"]["memt"] == {"session": h.session, "memory_read": True}
        if i + 1 < len(bodies):
            assert body["meta_info"]["finish_reason"] is None
        if "\ufffd" not in body["text"] and i + 1 < len(bodies):
            assert bodies[i + 1]["text"].startswith(body["text"])  # cumulative text, not deltas
    last = bodies[-1]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert last["text"] == whole["text"] and last["output_ids"] == whole["output_ids"]
    wire.ctl("close", h)


def test_stream_plain_generation_and_refused_streams(wire, http):
    whole = wire.plain(PROMPT, 5)
    status, frames = sse_frames(http, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5, "temperature": 0}, "stream": True})
    assert status == 200
    bodies = parse_frames(frames)
    assert bodies[-1]["output_ids"] == whole["output_ids"] and bodies[-1]["text"] == whole["text"]
    assert bodies[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert "memt" not in bodies[-1]["meta_info"]
    # a streamed commit is refused with a JSON error, not a stream
    h = wire.open()
    wire.ctl("begin", h, transaction="t")
    status, frames = sse_frames(http, {**wire.commit_body(h, "t", [1, 2, 3]), "stream": True})
    assert status == 400 and json.loads(frames[0])["error"]["type"] == "invalid_memory_request"
    # max_new_tokens 0 on a streamed query: one final frame, then [DONE]
    wire.ctl("abort", h, transaction="t")
    status, frames = sse_frames(http, wire.query_body(h, PROMPT, 0, stream=True))
    bodies = parse_frames(frames)
    assert [b["output_ids"] for b in bodies] == [[]] and bodies[-1]["meta_info"]["finish_reason"]["type"] == "length"
    wire.ctl("close", h)


# ---------------------------------------------------------------------- stop conditions


def test_stop_token_ids(wire):
    base = wire.plain(PROMPT, 12)["output_ids"]
    assert len(base) == 12
    stop = base[3]
    first = base.index(stop)
    result = wire.plain(PROMPT, 12, stop_token_ids=[stop])
    assert result["output_ids"] == base[: first + 1]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    h = wire.open()  # the same on a MemT query
    query = wire.query(h, PROMPT, 12, stop_token_ids=[stop])
    assert query["output_ids"] == base[: first + 1] and query["meta_info"]["finish_reason"]["matched"] == stop
    wire.ctl("close", h)


def _stop_string_case(wire):
    for prompt in ([17, 42, 99, 123, 7], [60, 61, 62], [300, 12, 5, 88], [101, 102, 103, 104], [9, 250, 33]):
        text = wire.plain(prompt, 16)["text"]
        for at in range(1, len(text) - 1):
            stop = text[at : at + 2]
            if stop.isprintable() and not stop.isspace() and "\ufffd" not in stop and text.find(stop) == at:
                return prompt, text, stop
    pytest.skip("no greedy output of the tiny model has a clean two-character stop string")


def test_stop_strings(wire, http):
    prompt, text, stop = _stop_string_case(wire)
    result = wire.plain(prompt, 16, stop=[stop])
    assert result["text"] == text[: text.find(stop)]
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    # a single string is accepted too, and streaming ends with the trimmed text
    status, frames = sse_frames(http, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "stop": stop}, "stream": True})
    bodies = parse_frames(frames)
    assert bodies[-1]["text"] == text[: text.find(stop)]
    assert bodies[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


# ---------------------------------------------------------------------- ordinary generation


def test_ordinary_generation_never_touches_memory(wire, http):
    h = wire.open()
    empty = wire.query(h, PROMPT, 10)["output_ids"]
    before = wire.plain(PROMPT, 10)
    assert before["output_ids"] == empty  # no memory read
    assert before["meta_info"]["id"] and "memt" not in before["meta_info"]
    wire.write(h, TURN, OTHER_TURN)
    remembered = wire.query(h, PROMPT, 10)["output_ids"]
    assert remembered != empty
    scrape = http.get("/metrics").text
    state = inspect(wire, h.session)
    # text and input_ids, with or without a (non-MemT) rid: same answers as before the write
    assert wire.plain(PROMPT, 10)["output_ids"] == empty
    named = wire.post_generate({"rid": "my-request-1", "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10, "temperature": 0}})
    assert named.status_code == 200 and named.json()["meta_info"]["id"] == "my-request-1"
    assert named.json()["output_ids"] == empty
    by_text = wire.plain(text="Please remember my name and my city.", max_new_tokens=6)
    assert by_text["meta_info"]["prompt_tokens"] > 0 and by_text["meta_info"]["completion_tokens"] == 6
    assert isinstance(by_text["text"], str)
    # a rid that merely starts with "memt" is reserved and validated as a MemT rid
    assert_error(wire.post_generate({"rid": "memtastic", "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}), 400)
    after = http.get("/metrics").text
    for name in ("memt_sessions", "memt_commits_total", "memt_write_events_total", "memt_commit_tokens_total"):
        assert metric(after, name) == metric(scrape, name), name
    assert inspect(wire, h.session) | {"lease_expires_in": 0} == state | {"lease_expires_in": 0}
    assert wire.query(h, PROMPT, 10)["output_ids"] == remembered
    wire.ctl("memory_read", h, enabled=False)
    assert wire.query(h, PROMPT, 10)["output_ids"] == empty
    wire.ctl("close", h)


# ---------------------------------------------------------------------- snapshot files


BAD_NAMES = [
    "..", "../escape.safetensors", "a/b.safetensors", "/tmp/absolute.safetensors", "sub/../x.safetensors",
    "x..safetensors", ".hidden.safetensors", "back\\slash.safetensors", "no-extension", "x.bin",
    "x.safetensors.tmp", "", "sp ace.safetensors", "x" * 200 + ".safetensors",
]


def test_snapshot_names_are_refused_and_nothing_is_written(wire, nano_server, tmp_path):
    state = nano_server.state_directory
    outside = tmp_path / "target.safetensors"
    outside.write_bytes(b"do not touch")
    (state / "link.safetensors").symlink_to(outside)
    (state / "dangling.safetensors").symlink_to(tmp_path / "missing.safetensors")
    try:
        h = wire.open()
        wire.write(h, TURN)
        wire.ctl("begin", h, transaction="t")
        listing = sorted(p.name for p in state.iterdir())
        failures = []
        for name in BAD_NAMES + ["link.safetensors", "dangling.safetensors"]:
            for overwrite in (False, True):
                response = wire.post_control({"action": "export", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                              "encoding": wire.encoding, "file": name, "overwrite": overwrite})
                if response.status_code != 400:
                    failures.append(f"export {name!r} overwrite={overwrite}: {response.status_code} {response.text}")
            response = wire.post_control({"action": "import", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                          "encoding": wire.encoding, "file": name, "transaction": "t"})
            if response.status_code != 400:
                failures.append(f"import {name!r}: {response.status_code} {response.text}")
        assert not failures, "\n".join(failures)
        assert_error(wire.post_control({"action": "export", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                        "encoding": wire.encoding, "file": 5}), 400)
        assert sorted(p.name for p in state.iterdir()) == listing
        assert outside.read_bytes() == b"do not touch"
        assert not (tmp_path / "missing.safetensors").exists()
        assert not (state.parent / "escape.safetensors").exists()
        assert wire.ctl("status", h)["receipts"]["t"]["imported"] is None
        wire.ctl("abort", h, transaction="t")
        wire.ctl("close", h)
    finally:
        (state / "link.safetensors").unlink()
        (state / "dangling.safetensors").unlink()


def test_export_overwrite_rules(wire, nano_server):
    h = wire.open()
    wire.write(h, TURN)
    file = f"{h.session}-overwrite.safetensors"
    path = nano_server.state_directory / file
    wire.export(h, file)
    first = path.read_bytes()
    wire.write(h, OTHER_TURN)
    assert_error(wire.post_control({"action": "export", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                    "encoding": wire.encoding, "file": file}), 409, match="overwrite")
    assert path.read_bytes() == first
    assert wire.export(h, file, overwrite=True)["file"] == file
    assert path.read_bytes() != first
    # the overwritten file imports and reproduces the current memory
    answer = wire.query(h, PROMPT, 8)["output_ids"]
    h2 = wire.open()
    wire.ctl("begin", h2, transaction="t")
    wire.ctl("import", h2, transaction="t", file=file, encoding=wire.encoding)
    wire.ctl("publish", h2, transaction="t")
    assert wire.query(h2, PROMPT, 8)["output_ids"] == answer
    assert not [p.name for p in nano_server.state_directory.iterdir() if p.name.startswith(".tmp-")]
    wire.ctl("close", h)
    wire.ctl("close", h2)


def test_delete_snapshot_removes_a_named_file_and_never_a_content_addressed_one(wire, nano_server):
    h = wire.open()
    wire.write(h, TURN)
    file = f"{h.session}-gone.safetensors"
    wire.export(h, file)
    hashed = wire.ctl("export", h, encoding=wire.encoding)["file"]  # content-addressed: sha256-<hex>
    # it needs what a control action needs: a session's valid lease (and the epoch, when given)
    assert_error(wire.post_control({"action": "delete_snapshot", "epoch": wire.epoch, "file": file}), 400, match="'session' is required")
    assert_error(wire.post_control({"action": "delete_snapshot", "epoch": wire.epoch, "session": h.session, "file": file}), 400, match="'lease' is required")
    assert_error(wire.post_control({"action": "delete_snapshot", "epoch": wire.epoch, "session": h.session, "lease": "forged", "file": file}), 409)
    assert_error(wire.post_control({"action": "delete_snapshot", "epoch": "stale", "session": h.session, "lease": h.lease, "file": file}), 409)
    assert (nano_server.state_directory / file).is_file()  # none of those deleted it
    assert wire.ctl("delete_snapshot", h, file=file) == {"file": file, "deleted": True}
    assert not (nano_server.state_directory / file).exists()
    assert wire.ctl("delete_snapshot", h, file=file) == {"file": file, "deleted": False}  # idempotent
    assert_error(wire.post_control({"action": "delete_snapshot", "epoch": wire.epoch, "session": h.session, "lease": h.lease, "file": hashed}), 400, match="content-addressed")
    assert (nano_server.state_directory / hashed).is_file()
    assert_error(wire.post_control({"action": "delete_snapshot", "epoch": wire.epoch, "session": h.session, "lease": h.lease, "file": "../x.safetensors"}), 400, match="snapshot")
    h2 = wire.open()
    wire.ctl("begin", h2, transaction="t")
    wire.ctl("import", h2, transaction="t", file=file, encoding=wire.encoding, expect=400)  # "does not exist"
    wire.ctl("close", h)
    wire.ctl("close", h2)


def test_import_refuses_bad_files(wire, nano_server, flash_server):
    state = nano_server.state_directory
    (state / "junk.safetensors").write_bytes(b"\x00" * 64)
    (state / "empty-file.safetensors").write_bytes(b"")
    # a valid memt-memory-v1 file of another model (Flash) carries another identity
    with flash_server.client() as flash_http:
        flash = Wire(flash_http)
        hf = flash.open()
        flash.write(hf, TURN)
        flash.export(hf, "from-flash.safetensors")
        flash.ctl("close", hf)
    (state / "from-flash.safetensors").write_bytes((flash_server.state_directory / "from-flash.safetensors").read_bytes())
    h = wire.open()
    wire.write(h, TURN)
    answer = wire.query(h, PROMPT, 8)["output_ids"]
    wire.ctl("begin", h, transaction="t")
    for file, match in [("junk.safetensors", "safetensors"), ("empty-file.safetensors", None),
                        ("from-flash.safetensors", "identity"), ("never-written.safetensors", "does not exist")]:
        assert_error(wire.post_control({"action": "import", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                        "transaction": "t", "file": file, "encoding": wire.encoding}), 400, match=match)
    wire.ctl("publish", h, transaction="t")  # the candidate was never touched
    assert wire.query(h, PROMPT, 8)["output_ids"] == answer
    wire.ctl("close", h)


def test_server_chosen_snapshot_names_for_any_session_id(wire, nano_server):
    """Session IDs may start with '.' or '-' or contain '..'; the server's own file names never do."""
    for session in ("..", ".x", "-x", "a..b", "..." + "z" * 150):
        h = wire.open(session)
        wire.write(h, [1, 2, 3])
        file = wire.export(h)["file"]
        assert file.endswith(".safetensors") and not file.startswith((".", "-")) and ".." not in file and "/" not in file
        assert (nano_server.state_directory / file).is_file()
        wire.ctl("close", h)


# ---------------------------------------------------------------------- odd but valid sampling values


def test_extreme_valid_sampling_values_are_served(wire):
    h = wire.open()
    for sampling in ({"temperature": 1e-320}, {"temperature": 0.7, "top_p": 1e-300}, {"temperature": 1e300},
                     {"top_k": 2**40, "temperature": 1.0, "seed": 2**63 - 1}, {"stop_token_ids": [10**30]}):
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, **sampling}}
        response = wire.post_generate(body)
        assert response.status_code == 200, (sampling, response.text)
        query = wire.post_generate({**wire.query_body(h, PROMPT, 3), "sampling_params": body["sampling_params"]})
        assert query.status_code == 200, (sampling, query.text)
    wire.ctl("close", h)


def test_stream_client_going_away_frees_the_session(wire, nano_server):
    h = wire.open()
    body = wire.query_body(h, PROMPT, 4000, stream=True)
    with nano_server.client() as client, client.stream("POST", "/generate", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                break  # leave after the first frame
    deadline = time.monotonic() + 30
    while inspect(wire, h.session)["in_flight"]:
        assert time.monotonic() < deadline, "the abandoned stream still holds the session"
        time.sleep(0.05)
    assert wire.query(h, PROMPT, 2)["meta_info"]["completion_tokens"] == 2
    wire.ctl("close", h)


def test_server_chosen_names_are_content_addressed(wire, nano_server):
    """Export without a name: the file is named by its SHA-256, so equal memories give one file, byte for byte."""
    a, b = wire.open(), wire.open()
    for handle in (a, b):
        wire.write(handle, [5, 6, 7], [8, 9])
    first, again, twin = wire.export(a)["file"], wire.export(a)["file"], wire.export(b)["file"]
    assert first == again == twin and first.startswith("sha256-")
    data = (nano_server.state_directory / first).read_bytes()
    assert first == f"sha256-{hashlib.sha256(data).hexdigest()}.safetensors"
    wire.write(a, [10])
    assert wire.export(a)["file"] != first
    # import checks the hash: an altered file is refused and nothing changes
    damaged = nano_server.state_directory / first
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    wire.ctl("begin", b, transaction="t-import")
    assert_error(wire.post_control({"action": "import", "session": b.session, "lease": b.lease, "epoch": wire.epoch,
                                    "transaction": "t-import", "file": first, "encoding": wire.encoding}),
                 400, match="does not hold the content")
    damaged.write_bytes(data)
    wire.ctl("import", b, transaction="t-import", file=first, encoding=wire.encoding)
    wire.ctl("publish", b, transaction="t-import")
    for handle in (a, b):
        wire.ctl("close", handle)


def test_read_history_in_inspect_and_status(wire):
    """Each finished query is logged with the published version it read, its tokens and why it ended."""
    h = wire.open()
    wire.query(h, PROMPT, 3)
    wire.write(h, [5, 6, 7])
    answer = wire.query(h, PROMPT, 2)
    reads = inspect(wire, h.session)["reads"]
    assert [r["memory_version"] for r in reads] == [0, 1]
    assert reads[1]["request_id"] == answer["meta_info"]["id"] and reads[1]["memory_read"] is True
    assert reads[1]["prompt_tokens"] == len(PROMPT) and reads[1]["completion_tokens"] == len(answer["output_ids"])
    assert reads[1]["finish_reason"] in ("length", "stop") and reads[1]["at"] >= reads[0]["at"] > 0
    assert wire.ctl("status", h)["reads"] == reads
    wire.ctl("close", h)
