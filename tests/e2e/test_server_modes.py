"""Server options over HTTP: ``--api-key`` (401), capacity limits (429), ``--enable-streaming-session``
(retain_kv) and no ``--state-directory``. One strict Nano server serves the module: API key,
streaming sessions, 2 sessions per rank, 1 in-flight commit per rank, no snapshot directory. Every
test closes the sessions it creates.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from e2e.servers import MemTServer
from e2e.wire import Wire, assert_error, metric, unique

pytestmark = pytest.mark.timeout(300)

API_KEY = "test-key-7f3a9c"
LONG_COMMIT = 16000  # tokens: a few seconds of CPU work on the tiny model


@pytest.fixture(scope="module")
def strict_server(nano_checkpoint, tmp_path_factory):
    server = MemTServer(
        nano_checkpoint,
        snapshots=False,
        api_key=API_KEY,
        args=["--enable-streaming-session", "--max-sessions-per-rank", "2", "--max-inflight-commits-per-rank", "1"],
    ).start()
    yield server
    server.close()


@pytest.fixture
def wire(strict_server):
    with strict_server.client() as http:
        wire = Wire(http)
        yield wire
        wire.close_all()  # free both session slots for the next test, even after a failure


# ---------------------------------------------------------------------- 401


def test_api_key_on_every_route_but_health(strict_server):
    routes = [
        ("GET", "/memt/identity", None), ("GET", "/memt/capabilities", None), ("GET", "/metrics", None),
        ("POST", "/memt/control", {"action": "inspect", "session": "s"}),
        ("POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}),
        ("POST", "/flush_cache", {}), ("GET", "/update_weights_from_disk", None),
    ]
    bad_headers = [
        {}, {"Authorization": "Bearer wrong-key"}, {"Authorization": f"Basic {API_KEY}"}, {"Authorization": API_KEY},
        {"Authorization": f"Bearer {API_KEY}x"}, {"Authorization": "Bearer"}, {"X-API-Key": API_KEY},
    ]
    with httpx.Client(base_url=strict_server.url, timeout=60) as http:
        assert http.get("/health").status_code == 200
        for method, path, body in routes:
            for headers in bad_headers:
                response = http.request(method, path, json=body, headers=headers)
                assert_error(response, 401, wire_type="authentication_error", match="API key")
                assert response.headers["www-authenticate"] == "Bearer"
        good = {"Authorization": f"Bearer {API_KEY}"}
        assert http.get("/memt/identity", headers=good).status_code == 200
        assert http.get("/metrics", headers=good).status_code == 200
        assert http.post("/generate", json=routes[4][2], headers=good).status_code == 200
        assert_error(http.post("/memt/control", json=routes[3][2], headers=good), 409)  # unknown session, not 401
        assert_error(http.post("/flush_cache", headers=good), 409)
        assert http.post("/memt/control", json={"action": "inspect", "session": "s"}, headers={"authorization": f"bearer {API_KEY}"}).status_code == 409
        # FastAPI's schema and docs pages are not served unauthenticated
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert http.get(path).status_code in (401, 404), path


# ---------------------------------------------------------------------- 429


def test_session_capacity_answers_429(wire):
    a = wire.open()
    b = wire.open()
    third = unique()
    assert_error(wire.post_control({"action": "create", "session": third, "epoch": wire.epoch}), 429, match="capacity")
    assert_error(wire.post_control({"action": "create", "session": unique(), "source": a.session, "source_lease": a.lease, "epoch": wire.epoch}), 429)
    wire.control("inspect", third, expect=409)  # nothing was created
    wire.ctl("close", a)
    c = wire.open(third)
    assert_error(wire.post_control({"action": "create", "epoch": wire.epoch}), 429)
    wire.ctl("close", b)
    wire.ctl("close", c)


def test_inflight_commit_capacity_answers_429(wire, strict_server):
    a = wire.open()
    b = wire.open()
    wire.ctl("begin", a, transaction="ta")
    wire.ctl("begin", b, transaction="tb")
    long_body = wire.commit_body(a, "ta", [(i * 7) % 400 + 10 for i in range(LONG_COMMIT)])
    result = {}

    def run():
        with strict_server.client() as http:
            result["response"] = http.post("/generate", json=long_body)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while metric(wire.http.get("/metrics").text, "memt_inflight_commits") < 1:
            assert time.monotonic() < deadline, "the long commit never started"
            time.sleep(0.02)
        refused = wire.post_generate(wire.commit_body(b, "tb", [1, 2, 3], "retry-me"))
        still_running = "response" not in result
    finally:
        worker.join(120)
    assert still_running, "the long commit finished too early for this test"
    assert_error(refused, 429, match="commit capacity")
    assert result["response"].status_code == 200
    assert result["response"].json()["meta_info"]["memt"]["committed_tokens"] == LONG_COMMIT
    # the refused commit left no receipt and did not use up its nonce
    assert wire.ctl("status", b)["receipts"]["tb"]["commits"] == []
    assert wire.commit(b, "tb", [1, 2, 3], nonce_="retry-me")["meta_info"]["memt"]["status"] == "applied"
    wire.ctl("publish", a, transaction="ta")
    wire.ctl("publish", b, transaction="tb")
    wire.ctl("close", a)
    wire.ctl("close", b)


# ---------------------------------------------------------------------- retain_kv


def test_retained_kv_must_extend_the_acknowledged_prefix(wire):
    h = wire.open(retain_kv=True)
    assert wire.control("inspect", h.session)["retain_kv"] is True
    prompt = [17, 42, 99, 123, 7, 8, 9]
    first = wire.query(h, prompt, 6, session_params={"id": h.session})["output_ids"]
    acknowledged = prompt + first

    # a query that does not extend the acknowledged tokens exactly is refused, and the context survives
    for wrong in (prompt, acknowledged[:-1] + [(acknowledged[-1] + 1) % 300], [5] + acknowledged, [1, 2, 3]):
        assert_error(wire.post_generate(wire.query_body(h, wrong + [11], 4)), 400, match="acknowledged prefix")
    assert_error(wire.post_generate(wire.query_body(h, acknowledged + [11], 4, session_params={"id": "other"})), 400)

    # the right extension reuses the context and answers exactly as a fresh prefill of the whole prompt
    extended = acknowledged + [11, 12, 13]
    second = wire.query(h, extended, 6)["output_ids"]
    assert second == wire.plain(extended, 6)["output_ids"]
    # and again, streaming this time
    extended2 = extended + second + [14]
    third = wire.query(h, extended2, 5)["output_ids"]
    assert third == wire.plain(extended2, 5)["output_ids"]

    # kv_reset drops the context: any prompt is accepted again
    assert wire.ctl("kv_reset", h) == {"session": h.session, "kv_reset": True}
    assert wire.query(h, [1, 2, 3], 3)["meta_info"]["finish_reason"]["type"] == "length"
    wire.ctl("close", h)


def test_retained_kv_with_memory(wire):
    """A retain_kv session with committed memory answers like a non-retaining session with the same memory."""
    h = wire.open(retain_kv=True)
    ref = wire.open()
    turn = list(range(20, 60))
    wire.write(h, turn)
    wire.write(ref, turn)
    prompt = [17, 42, 99]
    first = wire.query(h, prompt, 5)["output_ids"]
    assert first == wire.query(ref, prompt, 5)["output_ids"]
    extended = prompt + first + [30, 31]
    second = wire.query(h, extended, 5)["output_ids"]
    assert second == wire.query(ref, extended, 5)["output_ids"]
    # publishing new memory invalidates the retained context (rebuilt from the prompt) but keeps the prefix rule
    acknowledged = extended + second
    wire.write(h, [40, 41, 42])
    wire.write(ref, [40, 41, 42])
    assert_error(wire.post_generate(wire.query_body(h, prompt, 3)), 400, match="acknowledged prefix")
    assert wire.query(h, acknowledged + [7], 4)["output_ids"] == wire.query(ref, acknowledged + [7], 4)["output_ids"]
    wire.ctl("close", h)
    wire.ctl("close", ref)


# ---------------------------------------------------------------------- no --state-directory


def test_snapshots_without_a_state_directory_answer_400(wire):
    assert wire.capabilities["snapshots"] is False
    h = wire.open()
    wire.write(h, [1, 2, 3])
    for fields in ({}, {"file": "x.safetensors"}, {"file": "x.safetensors", "overwrite": True}):
        assert_error(wire.post_control({"action": "export", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                        "encoding": wire.encoding, **fields}), 400, match="state-directory")
    wire.ctl("begin", h, transaction="t")
    assert_error(wire.post_control({"action": "import", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                    "encoding": wire.encoding, "transaction": "t", "file": "x.safetensors"}), 400, match="state-directory")
    wire.ctl("abort", h, transaction="t")
    wire.ctl("close", h)
