"""Refusals of the OpenAI-compatible proxy, live: malformed bodies, bad headers, oversized prompts,
native errors mapped to OpenAI's, and an unreachable upstream — all in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``, and the proxy keeps serving afterwards.

This module runs its own small upstream (``--max-prefill-tokens 64 --max-sessions-per-rank 2``) and a
proxy without API keys in front of it.
"""

from __future__ import annotations

import time

import openai
import pytest
from e2e.proxies import MODEL, ProxyServer, assert_openai_error, expected_prompt, unique, upstream_metric
from e2e.servers import MemTServer, free_port

from memt_core.client.native import NativeClient
from memt_proxy.session.sessions import native_session_id

pytestmark = pytest.mark.timeout(600)

MAX_PREFILL = 64
LEASE_WAIT = 0.5
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def small_upstream(nano_checkpoint, tmp_path_factory):
    server = MemTServer(
        nano_checkpoint, state_directory=tmp_path_factory.mktemp("small-upstream"),
        args=["--max-prefill-tokens", str(MAX_PREFILL), "--max-sessions-per-rank", "2"],
    ).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def small(small_upstream, nano_checkpoint):
    with ProxyServer(small_upstream.url, nano_checkpoint, args=["--lease-wait", str(LEASE_WAIT)]) as server:
        yield server


@pytest.fixture
def http(small):
    with small.http(None) as client:
        yield client


def assert_up(http) -> None:
    response = http.post("/v1/chat/completions", json=GOOD)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


IMAGE = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}

MALFORMED = [
    # (name, body, param, code)
    ("no model", {"messages": [{"role": "user", "content": "x"}]}, "model", None),
    ("missing messages", {"model": MODEL}, "messages", None),
    ("empty messages", {"model": MODEL, "messages": []}, "messages", None),
    ("messages not a list", {"model": MODEL, "messages": "hello"}, "messages", None),
    ("bad role", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", None),
    ("content not text", {"model": MODEL, "messages": [{"role": "user", "content": 42}]}, "<prefix>messages.0.content", None),
    ("n=0", {**GOOD, "n": 0}, "n", None),
    ("top_logprobs without logprobs", {**GOOD, "top_logprobs": 3}, "top_logprobs", None),
    ("too many top_logprobs", {**GOOD, "logprobs": True, "top_logprobs": 21}, "top_logprobs", None),
    ("image part", {**GOOD, "messages": [{"role": "user", "content": IMAGE}]}, "messages[0].content", "unsupported_content"),
    ("bad schema", {**GOOD, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}}, "response_format", "invalid_schema"),
    ("response_format type", {**GOOD, "response_format": {"type": "xml"}}, "response_format", "unsupported_parameter"),
    ("penalty", {**GOOD, "presence_penalty": 2.5}, "presence_penalty", None),
    ("logit_bias value", {**GOOD, "logit_bias": {"5": 500}}, "logit_bias", None),
    ("logit_bias token", {**GOOD, "logit_bias": {"99999999": 1}}, "logit_bias", None),
    ("audio", {**GOOD, "modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
    ("legacy functions", {**GOOD, "functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ("temperature", {**GOOD, "temperature": 5}, "temperature", None),
    ("top_p", {**GOOD, "top_p": 0}, "top_p", None),
    ("max_tokens", {**GOOD, "max_tokens": 0}, "max_tokens", None),
    ("max tokens disagree", {**GOOD, "max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens", None),
    ("tool_choice without tools", {**GOOD, "tool_choice": "required"}, "tool_choice", None),
    ("tool_choice word", {**GOOD, "tools": [TOOL], "tool_choice": "always"}, "tool_choice", None),
    ("tool_choice unknown name", {**GOOD, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", None),
    ("tool without function", {**GOOD, "tools": [{"type": "function"}]}, "tools.0.function", None),
    ("tool result missing", {**GOOD, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "user", "content": "never mind"},
    ]}, "messages", "tool_results_missing"),
    ("unknown model", {**GOOD, "model": "gpt-4o"}, "model", "model_not_found"),
]


@pytest.mark.parametrize("name,body,param,code", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_bodies(http, name, body, param, code):
    response = http.post("/v1/chat/completions", json=body)
    status = 404 if code == "model_not_found" else 400
    error = assert_openai_error(response, status, type="invalid_request_error", code=code, param="<any>")
    if param.startswith("<prefix>"):
        assert (error["param"] or "").startswith(param[len("<prefix>"):]), error
    else:
        assert error["param"] == param, error
    # the same body with a session and streaming is refused the same way (before any stream starts)
    streamed = http.post("/v1/chat/completions", json={**body, "stream": True} if isinstance(body, dict) else body,
                         headers={"X-MemT-Session": "malformed", "X-MemT-Memory": "read"})
    assert streamed.status_code == status, streamed.text
    assert http.delete("/v1/memt/sessions/malformed").status_code == 404  # a refused request created no session


NO_TURN = [
    # nothing for the model to answer: refused with a session, without one and with memory off alike (issue 38)
    ("last message assistant", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
    ("only a system message", [{"role": "system", "content": "a"}]),
    ("no user message", [{"role": "assistant", "content": "b"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]),
    ("a tool result nobody called", [{"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]),
]


@pytest.mark.parametrize("name,messages", NO_TURN, ids=[m[0] for m in NO_TURN])
def test_a_request_must_ask_the_model_something(http, name, messages):
    for headers in ({"X-MemT-Session": "structure"}, {}, {"X-MemT-Memory": "off"}):
        response = http.post("/v1/chat/completions", json={**GOOD, "messages": messages}, headers=headers)
        assert_openai_error(response, 400, type="invalid_request_error", param="messages")
    assert http.delete("/v1/memt/sessions/structure").status_code == 404  # a refused request created no session


def test_non_json_bodies(http):
    for raw in (b"{not json", b"", b"\xff\xfe", b"[1, 2]", b"null", b'"text"'):
        response = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        error = assert_openai_error(response, 400, type="invalid_request_error")
        assert error["message"]
    assert_up(http)


def test_bad_headers(http):
    cases = [
        ({"X-MemT-Memory": "sometimes"}, "X-MemT-Memory", None),
        ({"X-MemT-Session": "has space"}, "X-MemT-Session", "invalid_session"),
        ({"X-MemT-Session": "x" * 161}, "X-MemT-Session", "invalid_session"),
        ({"X-MemT-Session": "a/b"}, "X-MemT-Session", "invalid_session"),
        ({"X-MemT-Session": "ok", "X-MemT-On-Divergence": "ignore"}, "X-MemT-On-Divergence", None),
    ]
    for headers, param, code in cases:
        error = assert_openai_error(http.post("/v1/chat/completions", json=GOOD, headers=headers), 400, type="invalid_request_error", param=param, code=code)
        assert param in error["message"] or "must" in error["message"]
    # header names and policy values are case-insensitive; unknown harmless fields are ignored
    response = http.post("/v1/chat/completions", json={**GOOD, "user": "u1", "metadata": {"a": "b"}, "store": False, "some_future_field": 1},
                         headers={"x-memt-memory": "OFF"})
    assert response.status_code == 200, response.text


def test_unknown_routes(http):
    assert_openai_error(http.get("/v1/nothing"), 404)
    assert_openai_error(http.get("/v1/chat/completions"), 405)
    assert_up(http)


def test_oversized_prompts(http, small):
    long = {"role": "user", "content": " ".join(f"word{i}" for i in range(80))}
    for extra, headers in (({}, {}), ({"stream": True}, {}), ({}, {"X-MemT-Session": "big"}), ({}, {"X-MemT-Session": "big", "X-MemT-Memory": "off"})):
        response = http.post("/v1/chat/completions", json={**GOOD, "messages": [long], **extra}, headers=headers)
        error = assert_openai_error(response, 400, type="invalid_request_error", code="context_length_exceeded", param="messages")
        assert str(MAX_PREFILL) in error["message"]
    client = small.openai("unused")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[long], max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded"
    assert_up(http)
    # a refused request creates nothing upstream (no native session takes a slot)
    assert_openai_error(http.get("/v1/memt/sessions/big"), 404, code="session_not_found")
    for messages in ([{"role": "assistant", "content": "hi"}], [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]):
        assert_openai_error(http.post("/v1/chat/completions", json={**GOOD, "messages": messages}, headers={"X-MemT-Session": "bad"}), 400)
    assert_openai_error(http.get("/v1/memt/sessions/bad"), 404, code="session_not_found")


def test_turn_longer_than_one_commit(http, small, small_upstream, proxy_chat_format):
    """A prompt that fits max_prefill_tokens whose answer makes the turn longer still gets committed:
    the proxy writes it in several commits of one transaction, cut at multiples of chunk_tokens."""
    words = 1
    while len(expected_prompt(proxy_chat_format, [{"role": "user", "content": "w " * (words + 1)}], None)) <= MAX_PREFILL:
        words += 1
    question = {"role": "user", "content": "w " * words}
    assert len(expected_prompt(proxy_chat_format, [question], None)) <= MAX_PREFILL
    client = small.openai("unused")

    def counters() -> tuple[float, float]:
        return upstream_metric(small_upstream, "memt_commits_total"), upstream_metric(small_upstream, "memt_commit_tokens_total")

    for seed in range(100):  # a reply that a stop string completes (the random model rarely ends a turn itself)
        session = unique("long-turn")
        commits, tokens = counters()
        reply = client.chat.completions.create(model=MODEL, messages=[question], max_tokens=12, seed=seed, temperature=1.0,
                                               stop=[" ", "e"], extra_headers={"X-MemT-Session": session})
        small.inspect(session, None)  # waits for the commit behind the answer
        commits, tokens = counters()[0] - commits, counters()[1] - tokens
        if reply.choices[0].finish_reason == "stop" and tokens > MAX_PREFILL:
            break
        assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200
    else:
        pytest.fail("no completed reply long enough in 100 seeds")
    assert commits == 2  # 64 tokens (two chunks of 32), then the rest
    assert small.inspect(session, None)["committed_messages"] == 2  # the whole turn is in memory
    # the next request resends everything: the committed turn is trimmed away
    follow = [question, {"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "hi"}]
    again = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=2, extra_headers={"X-MemT-Session": session})
    assert again.usage.prompt_tokens == len(expected_prompt(proxy_chat_format, [follow[-1]], None))
    assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200


def test_native_errors_map_to_openai(http, small, small_upstream):
    # 400: the upstream refuses prompt + max_new_tokens beyond its context length
    error = assert_openai_error(http.post("/v1/chat/completions", json={**GOOD, "max_tokens": 10**6}), 400, type="invalid_request_error")
    assert "context length" in error["message"]
    # 409: another client holds the native session's lease longer than --lease-wait
    session = unique("held")
    with NativeClient(small_upstream.url) as native:
        native.control("create", native_session_id("default", session), memory_read=True)  # the proxy adopts it
        lease = native.control("acquire", native_session_id("default", session), ttl=30)["lease"]
        started = time.monotonic()
        response = http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-Session": session})
        assert_openai_error(response, 409, type="conflict", code="session_conflict")
        assert LEASE_WAIT - 0.1 <= time.monotonic() - started < LEASE_WAIT + 5
        native.control("release", native_session_id("default", session), lease=lease)
    assert http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-Session": session}).status_code == 200
    assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200
    # 429: the upstream's session capacity (2) is full of sessions the proxy cannot offload (another client's);
    # idle sessions of its own it offloads instead (tests/e2e/test_proxy_offload.py)
    third = unique("third")
    with NativeClient(small_upstream.url) as native:
        blockers = [unique("blocker") for _ in range(2)]
        for name in blockers:
            native.control("create", name)
        assert_openai_error(http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-Session": third}), 429,
                            type="rate_limit_error", code="rate_limit_exceeded")
        with pytest.raises(openai.RateLimitError):
            small.openai("unused").chat.completions.create(**GOOD, extra_headers={"X-MemT-Session": third})
        for name in blockers:
            native.control("close", name, lease=native.control("acquire", name, ttl=30)["lease"])
    assert http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-Session": third}).status_code == 200
    assert http.delete(f"/v1/memt/sessions/{third}").status_code == 200


def test_upstream_unreachable_is_503(nano_checkpoint):
    with ProxyServer(f"http://127.0.0.1:{free_port()}", nano_checkpoint) as dead:
        with dead.http(None, timeout=30) as http:
            assert http.get("/v1/models").status_code == 200  # needs no upstream
            for headers, extra in (({}, {}), ({}, {"stream": True}), ({"X-MemT-Session": "s"}, {})):
                started = time.monotonic()
                response = http.post("/v1/chat/completions", json={**GOOD, **extra}, headers=headers)
                assert time.monotonic() - started < 10
                assert_openai_error(response, 503, type="upstream_error", code="upstream_unavailable")
                assert response.headers["retry-after"] == "1"  # the SDKs wait that long before their automatic retry
            assert_openai_error(http.get("/v1/memt/sessions/s"), 503, type="upstream_error")
        with pytest.raises(openai.InternalServerError) as info:
            dead.openai("unused").chat.completions.create(**GOOD)
        assert info.value.status_code == 503


def test_upstream_restart(http, small_upstream, proxy_chat_format):
    """A restarted upstream (new epoch, sessions gone): one 409 naming the restart, then the proxy has
    relearned the epoch and forgotten the lost memory, so the app's resent history becomes context."""
    session = unique("restart")
    first = [{"role": "user", "content": "hi"}]
    body = {**GOOD, "messages": first, "temperature": 1.0, "stop": [" ", "e"], "max_tokens": 16}
    reply = None
    for seed in range(20):
        response = http.post("/v1/chat/completions", json={**body, "seed": seed}, headers={"X-MemT-Session": session})
        assert response.status_code == 200, response.text
        if response.json()["choices"][0]["finish_reason"] == "stop":
            reply = response.json()["choices"][0]["message"]
            break
    assert reply is not None and http.get(f"/v1/memt/sessions/{session}").json()["committed_messages"] == 2
    small_upstream.restart()
    history = first + [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "and now?"}]
    error = assert_openai_error(http.post("/v1/chat/completions", json={**body, "messages": history}, headers={"X-MemT-Session": session}), 409, type="conflict")
    assert "restarted" in error["message"]
    response = http.post("/v1/chat/completions", json={**body, "messages": history}, headers={"X-MemT-Session": session})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == len(expected_prompt(proxy_chat_format, history, 0))
    assert http.post("/v1/chat/completions", json=GOOD).status_code == 200
    assert http.delete(f"/v1/memt/sessions/{session}").status_code == 200


def test_upstream_gone_after_start_is_503(http, small, small_upstream):
    """Last in this module: stop the upstream the proxy already knows; requests fail fast with 503."""
    session = unique("orphan")
    assert http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-Session": session}).status_code == 200
    small_upstream.stop()
    for headers in ({}, {"X-MemT-Session": session}):
        started = time.monotonic()
        response = http.post("/v1/chat/completions", json=GOOD, headers=headers)
        assert time.monotonic() - started < 10
        assert_openai_error(response, 503, type="upstream_error")
    assert_openai_error(http.get(f"/v1/memt/sessions/{session}"), 503, type="upstream_error")
    assert http.get("/health").status_code == 200



def test_context_overflow_is_a_400_before_the_stream(nano_checkpoint, tmp_path, proxy_chat_format):
    """Issue 48: a chat UI's 36 tool definitions on a small context (here 256 tokens): 400 context_length_exceeded,
    streamed or not, on both surfaces, before any byte of a stream, counted in /metrics as a 400. A request that
    sets no max_tokens gets what fits beside its prompt and never fails for a limit it did not set."""
    context = 256
    upstream = MemTServer(nano_checkpoint, args=["--context-length", str(context)]).start()
    try:
        with ProxyServer(upstream.url, nano_checkpoint) as proxy, proxy.http(None) as http:
            tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"Tool number {i} does a thing.",
                                                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}} for i in range(36)]
            big = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
            for extra in ({}, {"stream": True}, {"max_tokens": 5}):
                response = http.post("/v1/chat/completions", json={**big, **extra})
                error = assert_openai_error(response, 400, code="context_length_exceeded", param="max_tokens" if "max_tokens" in extra else "messages")
                assert str(context) in error["message"]
            responses_big = {"model": MODEL, "input": "hi", "tools": [{"type": "function", **t["function"]} for t in tools]}
            for extra in ({}, {"stream": True}):
                response = http.post("/v1/responses", json={**responses_big, **extra})
                assert_openai_error(response, 400, code="context_length_exceeded", param="input")
            words = 1
            while len(expected_prompt(proxy_chat_format, [{"role": "user", "content": "w " * (words + 1)}], None)) < context - 20:
                words += 1
            near = [{"role": "user", "content": "w " * words}]
            prompt = len(expected_prompt(proxy_chat_format, near, None))
            fits = http.post("/v1/chat/completions", json={"model": MODEL, "messages": near, "temperature": 1.0, "seed": 1})
            assert fits.status_code == 200, fits.text
            assert fits.json()["usage"]["prompt_tokens"] == prompt and fits.json()["usage"]["completion_tokens"] <= context - prompt
            assert_openai_error(http.post("/v1/chat/completions", json={"model": MODEL, "messages": near, "max_tokens": context}), 400,
                                code="context_length_exceeded", param="max_tokens")
            metrics = http.get("/metrics").text
            refused = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                          if line.startswith("memt_proxy_requests_total{") and 'status="400"' in line)
            assert refused >= 6
    finally:
        upstream.close()
