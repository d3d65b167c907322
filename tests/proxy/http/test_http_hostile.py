"""Hostile request bodies against the proxy's HTTP layer, in-process (the upstream is a closed port).

Each case once answered 500 (issue 13): huge integers, deep nesting (also inside unknown fields and
tool-call arguments), content parts of the wrong type, odd ``tool_choice`` shapes, lone surrogates, and
bodies past the size limit. Every one must be a 4xx in OpenAI's error shape that names the field, and
decided before the upstream is asked (a closed upstream would answer 503).
"""

from __future__ import annotations

import json
import socket

import pytest
from fastapi.testclient import TestClient

from memt_proxy.__main__ import build_app, build_parser

MODEL = "tiny-random-nano"
HUGE = "9" * 5000


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def body(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def deep(depth: int, inner: str = "0") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.fixture(scope="module")
def http(nano_checkpoint):
    args = build_parser().parse_args([
        "--upstream", f"http://127.0.0.1:{closed_port()}", "--model-path", str(nano_checkpoint),
        "--api-key", "key-a", "--timeout", "5", "--max-request-bytes", "65536",
    ])
    with TestClient(build_app(args)[0], headers={"Authorization": "Bearer key-a"}) as client:
        yield client


def post_raw(http, text: str, path: str = "/v1/chat/completions", **headers):
    return http.post(path, content=text.encode("utf-8", "surrogatepass"), headers={"Content-Type": "application/json", **headers})


@pytest.mark.parametrize("where", ["max_tokens", "seed", "unknown_field", "temperature"])
def test_a_5000_digit_integer_anywhere_is_a_400(http, where):
    text = json.dumps(body(**{where: 1}), separators=(",", ":")).replace(f'"{where}":1', f'"{where}":{HUGE}')
    error = error_of(post_raw(http, text), 400)
    assert "5000 digits" in error["message"]


@pytest.mark.parametrize("field, value", [("max_tokens", 10**60), ("seed", -(10**40)), ("n", 10**30), ("top_logprobs", 10**20)])
def test_large_but_parseable_integers_are_refused_by_the_model(http, field, value):
    error = error_of(http.post("/v1/chat/completions", json=body(**{field: value})), 400)
    assert error["param"] == field


@pytest.mark.parametrize("template", [
    '{{"model": "{m}", "messages": {deep}}}',
    '{{"model": "{m}", "messages": [{{"role": "user", "content": "hi"}}], "unknown": {deep}}}',
    '{{"model": "{m}", "messages": [{{"role": "user", "content": "hi"}}], "metadata": {{"x": {deep}}}}}',
    '{{"model": "{m}", "messages": [{{"role": "user", "content": "hi"}}], "tools": [{{"type": "function", "function": {{"name": "f", "parameters": {{"a": {deep}}}}}}}]}}',
])
def test_nesting_10000_deep_is_a_400(http, template):
    text = template.format(m=MODEL, deep=deep(10_000))
    error = error_of(post_raw(http, text), 400)
    assert "nests deeper" in error["message"]


def test_nesting_inside_tool_call_arguments_is_only_text(http):
    """Tool-call arguments are a string: a deep JSON document inside it is text, not nesting, and harmless."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep(10_000)}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert response.status_code in (400, 503), response.text  # decided by the (closed) upstream at the latest
    # tool-call arguments that are not a string are refused by shape
    messages[1]["tool_calls"][0]["function"]["arguments"] = {"a": 1}
    assert error_of(http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}), 400)["param"].startswith("messages.1.tool_calls")


@pytest.mark.parametrize("part", [{"type": "text", "text": 5}, {"type": "text", "text": ["a"]}, {"type": "text"}, {"type": 7}, "text"])
def test_content_parts_of_the_wrong_shape_are_a_400(http, part):
    error = error_of(http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": [part]}]}), 400)
    assert error["param"].startswith("messages")


@pytest.mark.parametrize("choice", [{"function": "f"}, {"function": 5}, {"function": {"name": []}}, {"type": "function"}, 5, "sometimes", []])
def test_odd_tool_choice_shapes_are_a_400(http, choice):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    error = error_of(http.post("/v1/chat/completions", json=body(tools=tools, tool_choice=choice)), 400)
    assert error["param"].startswith("tool_choice")


@pytest.mark.parametrize("place", ["content", "system", "tool name", "stream", "key"])
def test_lone_surrogates_are_a_400_naming_where(http, place):
    request = body()
    if place == "content":
        request["messages"][0]["content"] = "a\ud800b"
    elif place == "system":
        request["messages"].insert(0, {"role": "system", "content": "\udfff"})
    elif place == "tool name":
        request["tools"] = [{"type": "function", "function": {"name": "f\ud83d"}}]
    elif place == "stream":
        request.update(stream=True, stop=["\ud800"])
    else:
        request["metadata"] = {"\ud800": "x"}
    text = json.dumps(request)  # ASCII escapes: "\ud800" reaches the server as JSON text
    error = error_of(post_raw(http, text), 400)
    assert "surrogate" in error["message"]
    if place != "key":
        assert error["param"].startswith(("messages", "tools", "stop")), error


def test_a_body_over_the_limit_is_a_413_from_its_declared_length(http):
    text = json.dumps(body(padding="x" * 70_000))
    error = error_of(post_raw(http, text), 413)
    assert "65536" in error["message"] and "--max-request-bytes" in error["message"]


def test_a_chunked_body_over_the_limit_is_a_413(http):
    text = json.dumps(body(padding="x" * 70_000)).encode()
    error = error_of(http.post("/v1/chat/completions", content=iter([text[:40_000], text[40_000:]]), headers={"Content-Type": "application/json"}), 413)
    assert "65536" in error["message"]


@pytest.mark.parametrize("path, payload", [
    ("/v1/memt/sessions/s/snapshots", '{"name": "a\\ud800.safetensors"}'),
    ("/v1/memt/sessions/s/restore", '{"name": ' + HUGE + '}'),
    ("/v1/memt/sessions/s/restore", '{"name": ' + deep(10_000, '"x"') + '}'),
    ("/v1/memt/sessions/s/restore", '{"name": "x.safetensors", "extra": 1}'),
    ("/v1/memt/sessions/s/snapshots", '{"overwrite": "maybe"}'),
])
def test_admin_bodies_are_parsed_defensively(http, path, payload):
    error_of(post_raw(http, payload, path), 400)


def test_error_messages_do_not_echo_large_input(http):
    name = "x" * 30_000 + ".safetensors"
    response = http.post("/v1/memt/sessions/s/restore", json={"name": name})
    error = error_of(response, 400)
    assert len(response.content) < 4000 and error["param"] == "name"


def test_openapi_and_docs_need_the_key(http):
    assert http.get("/openapi.json").status_code == 200
    assert http.get("/docs").status_code == 200
    for path in ("/openapi.json", "/docs"):
        error_of(http.get(path, headers={"Authorization": "Bearer wrong"}), 401)
    assert http.get("/health", headers={"Authorization": "Bearer wrong"}).json() == {"status": "ok"}


def test_the_openapi_document_describes_the_request_bodies(http):
    paths = http.get("/openapi.json").json()["paths"]
    chat = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "messages"} <= set(chat["required"]) and "$ref" not in json.dumps(chat)
    assert "name" in paths["/v1/memt/sessions/{session}/restore"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]


def test_readiness_reflects_the_unreachable_upstream(http):
    error = error_of(http.get("/health/ready"), 503)
    assert error["message"].startswith("not ready")
    assert http.get("/health").status_code == 200  # liveness asks nobody


@pytest.mark.parametrize("path, field, value", [
    ("/v1/chat/completions", "max_tokens", "5"), ("/v1/chat/completions", "stream", "yes"), ("/v1/chat/completions", "temperature", "0.5"),
    ("/v1/chat/completions", "seed", 1.5), ("/v1/chat/completions", "logprobs", 1), ("/v1/chat/completions", "stream_options", {"include_usage": "true"}),
    ("/v1/responses", "max_output_tokens", "5"), ("/v1/responses", "stream", "yes"), ("/v1/responses", "store", "no"),
])
def test_numbers_and_booleans_are_typed_as_openai_types_them(http, path, field, value):
    """A string is no integer and "yes" no boolean: refused naming the field, as OpenAI does, not coerced (issue 38)."""
    request = body(**{field: value}) if path.endswith("completions") else {"model": MODEL, "input": "hi", field: value}
    error = error_of(http.post(path, json=request), 400)
    assert (error["param"] or "").startswith(field), error
