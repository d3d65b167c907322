"""Sessions through the OpenAI-compatible proxy (live memt_core + proxy, official ``openai`` SDK):
tenants, 16 concurrent sessions, the one-request-per-session rule, client disconnects, edited history
and the session admin routes.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from e2e.proxies import (
    KEY_A, KEY_B, LEASE_WAIT, LONG_MESSAGES, LONG_TOKENS, MODEL, STOPS, ask, assert_openai_error, assistant, completed_turn,
    expected_prompt, leave_stream_early, unique, upstream_metric,
)

from memt_proxy.session.sessions import native_session_id

pytestmark = pytest.mark.timeout(600)

@pytest.fixture(scope="module")
def client(proxy):
    return proxy.openai()


# ---------------------------------------------------------------------- tenants


def test_tenants_have_separate_memories(proxy, proxy_chat_format):
    alpha, beta = proxy.openai(KEY_A), proxy.openai(KEY_B)
    session = unique("shared")
    first = [{"role": "user", "content": "My name is Ada and I live in Oslo."}]
    reply = completed_turn(alpha, session, first)
    history = first + [assistant(reply.choices[0].message)]
    info_a = proxy.inspect(session, KEY_A)
    assert info_a["committed_messages"] == 2 and info_a["native"]["published_version"] >= 1

    # tenant beta has no such session until it uses the name
    with proxy.http(KEY_B) as http:
        assert_openai_error(http.get(f"/v1/memt/sessions/{session}"), 404, code="session_not_found")
    question = {"role": "user", "content": "Where do I live?"}
    b_read = ask(beta, [question], session, memory="read", seed=5, stop=None, max_tokens=30)
    info_b = proxy.inspect(session, KEY_B)
    assert info_b["committed_messages"] == 0 and info_b["native"]["published_version"] == 0
    assert info_b["native"]["session"] != info_a["native"]["session"]
    assert info_a["native"]["session"] == native_session_id("alpha", session)
    assert info_b["native"]["session"] == native_session_id("beta", session)

    # the same question with the same seed: same prompt, but alpha's memory holds the first turn
    a_read = ask(alpha, [question], session, memory="read", seed=5, stop=None, max_tokens=30)
    assert a_read.usage.prompt_tokens == b_read.usage.prompt_tokens
    assert a_read.choices[0].message.content != b_read.choices[0].message.content
    stateless = ask(alpha, [question], seed=5, stop=None, max_tokens=30)
    assert b_read.choices[0].message.content == stateless.choices[0].message.content  # beta's memory is empty

    # alpha resends the full history: trimmed to the new turn; beta sending the same history gets it as context
    full = history + [question]
    a_full = ask(alpha, full, session, memory="read", seed=5)
    b_full = ask(beta, full, session, memory="read", seed=5)
    assert a_full.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, full, 2))
    assert b_full.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, full, 0))
    assert b_full.usage.prompt_tokens > a_full.usage.prompt_tokens
    assert proxy.inspect(session, KEY_A)["committed_messages"] == 2
    assert proxy.inspect(session, KEY_B)["committed_messages"] == 0


def test_wrong_or_missing_key_is_401(proxy):
    bad = proxy.openai("key-wrong")
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert info.value.status_code == 401 and info.value.body["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for key in ("key-wrong", None, "key-alpha-but-longer"):
        with proxy.http(key) as http:
            assert_openai_error(http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}), 401,
                                type="authentication_error", code="invalid_api_key")
            assert_openai_error(http.get("/v1/memt/sessions/anything"), 401, type="authentication_error")
    with proxy.http(None) as http:
        assert http.get("/health").status_code == 200


# ---------------------------------------------------------------------- concurrency


def test_sixteen_concurrent_sessions(proxy, proxy_chat_format):
    sessions = [unique(f"c{i}") for i in range(16)]
    client = proxy.async_openai()
    results: dict[str, list[tuple[str, int, int]]] = {}

    async def conversation(index: int, session: str) -> None:
        history, committed, log = [], 0, []
        for turn in range(5):
            history.append({"role": "user", "content": f"Session {index} says {'abc'[turn % 3] * (index + 1)} at turn {turn}."})
            expected = len(expected_prompt(proxy_chat_format, history, committed))
            response = await client.chat.completions.create(
                model=MODEL, messages=history, temperature=1.0, seed=index * 10 + turn,
                max_tokens=1 if (index + turn) % 4 == 3 else 24, stop=None if (index + turn) % 4 == 3 else STOPS,
                extra_headers={"X-MemT-Session": session},
            )
            finish = response.choices[0].finish_reason
            log.append((finish, response.usage.prompt_tokens, expected))
            history.append(assistant(response.choices[0].message))
            if finish == "stop":
                committed = len(history)
        results[session] = log + [("committed", committed, 0)]

    async def main():
        await asyncio.gather(*(conversation(i, s) for i, s in enumerate(sessions)))
        await client.close()

    started = time.monotonic()
    asyncio.run(main())
    elapsed = time.monotonic() - started
    assert len(results) == 16
    for session, log in results.items():
        *turns, (_, committed, _) = log
        for finish, got, expected in turns:
            assert got == expected, (session, turns)
        info = proxy.inspect(session)
        assert info["committed_messages"] == committed, (session, turns, info)
        assert info["native"]["in_flight"] == [] and info["native"]["transaction"] is None  # the lease is kept between turns
    print(f"16 sessions x 5 turns in {elapsed:.1f} s")


def _long_stream(proxy, session, seed, events: dict, *, key=KEY_A, until: threading.Event | None = None):
    """A long stream on ``session``; records when its first and last bytes arrived. With ``until``, it cannot
    end early (``min_tokens``) and runs until the event is set, then leaves (the proxy cancels the query)."""
    tokens = LONG_TOKENS if until is None else 8 * LONG_TOKENS
    body = {"model": MODEL, "messages": LONG_MESSAGES, "max_tokens": tokens, "temperature": 1.0, "seed": seed, "stream": True}
    if until is not None:
        body["min_tokens"] = tokens
    with proxy.http(key) as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-MemT-Session": session, "X-MemT-Memory": "read"}) as response:
            events["status"] = response.status_code
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.setdefault("first", time.monotonic())
                    events["last"] = time.monotonic()
                    if "[DONE]" in line:
                        events["done"] = True
                if until is not None and until.is_set():
                    return


def _idle(upstream, tenant: str, session: str) -> None:
    """Return once ``session`` has no query in flight upstream (state, not a sleep)."""
    native = native_session_id(tenant, session)
    deadline = time.monotonic() + 120
    while True:
        with upstream.client() as http:
            response = http.post("/memt/control", json={"action": "inspect", "session": native, "epoch": upstream.epoch()})
        if response.status_code == 200 and not response.json()["in_flight"]:
            return
        assert time.monotonic() < deadline, response.text
        time.sleep(0.01)


def _holding(upstream, tenant: str, session: str, done: dict) -> None:
    """Return once the request started in another thread holds ``session``: its query is in flight upstream
    (or it has already finished). State, not a sleep: building that thread's client can take any time."""
    native = native_session_id(tenant, session)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "at" not in done:
        with upstream.client() as http:
            response = http.post("/memt/control", json={"action": "inspect", "session": native, "epoch": upstream.epoch()})
        if response.status_code == 200 and response.json()["in_flight"]:
            return
        time.sleep(0.01)
    assert "at" in done, "the first request never reached the upstream"


def test_one_request_per_session(proxy, proxy_upstream, long_seed):
    """A second request on a busy session waits up to --lease-wait, then 409 session_busy; other sessions run."""
    client = proxy.openai()
    session, other = unique("busy"), unique("free")
    first: dict = {}
    let_go = threading.Event()
    thread = threading.Thread(target=_long_stream, args=(proxy, session, long_seed, first), kwargs={"until": let_go})
    thread.start()
    while "first" not in first:
        time.sleep(0.01)
    with pytest.raises(openai.ConflictError) as info:
        ask(client, [{"role": "user", "content": "me too"}], session, max_tokens=2)
    assert info.value.body["code"] == "session_busy" and info.value.body["type"] == "conflict"
    # another session is served while the long stream still runs (it runs until let go)
    parallel = ask(client, [{"role": "user", "content": "elsewhere"}], other, max_tokens=2)
    assert parallel.choices[0].finish_reason in ("stop", "length")
    assert first["status"] == 200 and "done" not in first, "the long stream ended before it was let go"
    let_go.set()
    thread.join(120)
    _idle(proxy_upstream, "alpha", session)  # the left stream's query is cancelled and the session let go

    # a second request that arrives while a short first one runs waits for it, then succeeds
    short_done: dict = {}

    def short():
        response = ask(proxy.openai(), [{"role": "user", "content": "first"}], session, seed=3, max_tokens=60, stop=None)
        short_done["at"], short_done["response"] = time.monotonic(), response

    thread = threading.Thread(target=short)
    thread.start()
    _holding(proxy_upstream, "alpha", session, short_done)  # the second is sent only once the first holds the session
    second = ask(client, [{"role": "user", "content": "second"}], session, seed=4, max_tokens=2, stop=None)
    second_done = time.monotonic()
    thread.join(60)
    assert short_done["response"].choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second_done >= short_done["at"] - 0.05
    info = proxy.inspect(session)
    assert info["native"]["in_flight"] == [] and info["native"]["transaction"] is None


def test_client_disconnect_cancels_upstream_and_releases(proxy, proxy_upstream, long_seed):
    session = unique("gone")
    tokens_before = upstream_metric(proxy_upstream, "memt_generation_tokens_total")
    leave_stream_early(proxy, session, long_seed)
    disconnected = time.monotonic()
    while upstream_metric(proxy_upstream, "memt_running_requests") > 0:
        assert time.monotonic() - disconnected < 10, "the upstream query kept running after the client left"
        time.sleep(0.05)
    generated = upstream_metric(proxy_upstream, "memt_generation_tokens_total") - tokens_before
    assert generated < LONG_TOKENS, f"the upstream generated all {generated} tokens: the query was not cancelled"
    # the session is free again: nothing in flight (its lease kept for its next request), and the next request runs at once
    native = proxy.inspect(session)["native"]
    assert native["in_flight"] == [] and native["transaction"] is None
    started = time.monotonic()
    response = ask(proxy.openai(), [{"role": "user", "content": "still there?"}], session, max_tokens=4)
    assert time.monotonic() - started < LEASE_WAIT + 5
    assert response.choices[0].finish_reason in ("stop", "length")
    assert proxy.inspect(session)["committed_messages"] in (0, 2)


# ---------------------------------------------------------------------- edited history


def test_edited_history_diverges(proxy, client, proxy_chat_format):
    session = unique("div")
    first = [{"role": "user", "content": "The code word is tangerine."}]
    reply = completed_turn(client, session, first)
    history = first + [assistant(reply.choices[0].message)]
    edited = [{"role": "user", "content": "The code word is banana."}, history[1], {"role": "user", "content": "What is the code word?"}]
    with proxy.http() as http:
        body = {"model": MODEL, "messages": edited, "max_tokens": 4, "temperature": 1.0, "seed": 1}
        strict = {"X-MemT-Session": session, "X-MemT-On-Divergence": "error"}
        error = assert_openai_error(http.post("/v1/chat/completions", json=body, headers=strict), 409,
                                    type="conflict", code="transcript_diverged", param="messages")
        assert "reset" in error["message"]
        assert_openai_error(http.post("/v1/chat/completions", json=body, headers={"X-MemT-Session": session, "X-MemT-On-Divergence": "maybe"}), 400,
                            param="X-MemT-On-Divergence")
    with pytest.raises(openai.ConflictError):
        ask(client, edited, session, headers={"X-MemT-On-Divergence": "reject"})  # the old name of error
    assert proxy.inspect(session)["committed_messages"] == 2  # nothing changed
    # by default the edit branches: memory starts over and takes the edited transcript as context
    response = ask(client, edited, session, seed=2)
    assert response.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, edited, 0))
    info = proxy.inspect(session)
    assert info["committed_messages"] == (4 if response.choices[0].finish_reason == "stop" else 0)
    # an unchanged continuation is trimmed as usual
    continued = edited + [assistant(response.choices[0].message), {"role": "user", "content": "Thanks."}]
    again = ask(client, continued, session, seed=3)
    assert again.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, continued, info["committed_messages"]))


# ---------------------------------------------------------------------- admin routes


def test_session_admin_routes(proxy, client):
    source, target = unique("adm-src"), unique("adm-dst")
    snapshot = f"{source}.safetensors"
    first = [{"role": "user", "content": "Remember: the meeting is on Tuesday."}]
    completed_turn(client, source, first)
    question = [{"role": "user", "content": "When is the meeting?"}]

    def answer(session):
        return ask(client, question, session, memory="read", seed=9, stop=None, max_tokens=24).choices[0].message.content

    remembered, empty = answer(source), ask(client, question, seed=9, stop=None, max_tokens=24).choices[0].message.content
    assert remembered != empty
    with proxy.http() as http:
        info = http.get(f"/v1/memt/sessions/{source}").json()
        assert info["session"] == source and info["committed_messages"] == 2 and info["pending_tool_calls"] is False
        reads = info["native"]["reads"]  # the read history: which memory version each answer read
        assert reads and reads[-1]["memory_read"] is True and reads[-1]["memory_version"] == info["native"]["published_version"]
        saved = http.post(f"/v1/memt/sessions/{source}/snapshots", json={"name": snapshot})
        assert saved.status_code == 200, saved.text
        assert saved.json()["snapshot"] == snapshot
        assert_openai_error(http.post(f"/v1/memt/sessions/{source}/snapshots", json={"name": snapshot}), 409, type="conflict")  # exists
        assert http.post(f"/v1/memt/sessions/{source}/snapshots", json={"name": snapshot, "overwrite": True}).status_code == 200
        assert_openai_error(http.post(f"/v1/memt/sessions/{source}/snapshots", json={"name": "../x.safetensors"}), 400, param="name")
        assert_openai_error(http.post(f"/v1/memt/sessions/{target}/restore", json={"name": snapshot}), 404, code="session_not_found")
        ask(client, question, target, memory="read", max_tokens=2)  # the target session exists from its first request
        restored = http.post(f"/v1/memt/sessions/{target}/restore", json={"name": snapshot})
        assert restored.status_code == 200, restored.text
        assert restored.json() == {"restored": snapshot}
        assert_openai_error(http.post(f"/v1/memt/sessions/{target}/restore", json={}), 400, param="name")
        assert_openai_error(http.post(f"/v1/memt/sessions/{target}/restore", json={"name": "missing.safetensors"}), 400)
        assert http.get(f"/v1/memt/sessions/{target}").json()["committed_messages"] == 0
    assert answer(target) == remembered  # the restored memory answers like the original
    with proxy.http() as http:
        assert http.post(f"/v1/memt/sessions/{source}/reset").json() == {"reset": True}
        info = http.get(f"/v1/memt/sessions/{source}").json()
        assert info["committed_messages"] == 0
    assert answer(source) == empty  # reset: memory is empty again
    with proxy.http() as http:
        assert http.delete(f"/v1/memt/sessions/{source}").json() == {"closed": True}
        assert_openai_error(http.get(f"/v1/memt/sessions/{source}"), 404, code="session_not_found")
        assert_openai_error(http.get("/v1/memt/sessions/bad%20name"), 400, param="X-MemT-Session")
        assert http.delete(f"/v1/memt/sessions/{target}").status_code == 200
        paths = http.get("/openapi.json").json()["paths"]
    assert {"get", "delete"} <= set(paths["/v1/memt/sessions/{session}"])
    for route in ("snapshots", "restore", "reset"):
        assert "post" in paths[f"/v1/memt/sessions/{{session}}/{route}"]
    assert "/v1/chat/completions" in paths and "/v1/models" in paths
    # a closed session can be used again from scratch
    again = ask(client, first, source, seed=1)
    assert again.usage.prompt_tokens > 0


def test_proxy_sessions_client(proxy, client):
    """memt_core.client.ProxySessions (what the integrations use) over the admin routes, errors typed by status."""
    from memt_core.client import MemTClientError, ProxySessions
    from memt_core.errors import AuthenticationError

    sessions = ProxySessions(proxy.base_url, api_key=KEY_A, timeout=60)
    session = unique("admin-client")
    with pytest.raises(MemTClientError) as info:
        sessions.inspect(session)
    assert info.value.status == 404 and "does not exist" in str(info.value)
    completed_turn(client, session, [{"role": "user", "content": "remember me"}])
    assert sessions.inspect(session)["committed_messages"] == 2
    name = sessions.save(session, f"{session}.safetensors")
    assert sessions.reset(session) == {"reset": True}
    assert sessions.inspect(session)["committed_messages"] == 0
    assert sessions.restore(session, name) == {"restored": name}
    with pytest.raises(MemTClientError) as info:
        sessions.save(session, name)  # exists, no overwrite
    assert info.value.status == 409
    with pytest.raises(MemTClientError) as info:
        ProxySessions(proxy.base_url, api_key="wrong").inspect(session)
    assert info.value.status == 401 and isinstance(info.value.cause, AuthenticationError)
    assert sessions.close(session) == {"closed": True}
