"""``memt_proxy.http.route_inputs``, on requests built in-process (no app, no server): the tenant by API key, the
session header checked, each control read from its header or the body's ``metadata`` (the two agreeing), the body read
within its bounds and validated naming the field, and SSE frames ending in ``[DONE]`` with an error frame before it."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request

from memt_core.client.errors import MemTClientError
from memt_proxy.errors import NotFound, ProxyError
from memt_proxy.http.route_inputs import Controls, Inputs, request_body, request_context, sse
from memt_proxy.session.retries import request_digest


def request(headers: dict | None = None, body: bytes | None = None) -> Request:
    """A request as the app receives it, its body sent in one message."""
    sent = [("content-length", str(len(body))) if body is not None else None, *((k.lower(), v) for k, v in (headers or {}).items())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(k.encode(), v.encode()) for k, v in filter(None, sent)]}
    messages = [{"type": "http.request", "body": body or b"", "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return Request(scope, receive)


def refusal(call) -> tuple[int, str | None, str | None]:
    with pytest.raises(ProxyError) as refused:
        result = call()
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    return refused.value.status, refused.value.code, refused.value.param


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    size: int = 0


def test_the_tenant_is_the_api_keys_and_default_without_keys():
    keyed = Inputs({"key-a": "alpha"})
    assert keyed.tenant(request({"Authorization": "Bearer key-a"})) == "alpha"
    assert refusal(lambda: keyed.tenant(request({"Authorization": "Bearer nope"})))[:2] == (401, "invalid_api_key")
    assert refusal(lambda: keyed.tenant(request()))[:2] == (401, "invalid_api_key")
    assert Inputs().tenant(request({"Authorization": "Bearer anything"})) == "default"


def test_a_session_name_is_checked():
    assert Inputs.session(None) is None and Inputs.session("chat-1") == "chat-1"
    assert refusal(lambda: Inputs.session("no spaces")) == (400, "invalid_session", "X-MemT-Session")


def test_controls_come_from_a_header_or_the_bodys_metadata_and_must_agree():
    assert Inputs.controls(request()) == Controls()
    headed = Inputs.controls(request({"X-MemT-Memory": "READ", "Idempotency-Key": "k1", "x-stainless-retry-count": "1"}))
    assert headed == Controls(memory="read", idempotency_key="k1", retry=True)
    carried = Inputs.controls(request(), {"memt_memory": "off", "memt_on_divergence": "error", "memt_idempotency_key": "k2"})
    assert carried == Controls(memory="off", on_divergence="error", idempotency_key="k2")
    assert Inputs.controls(request({"X-MemT-Memory": "off"}), {"memt_memory": "off"}).memory == "off"  # the same value twice
    assert refusal(lambda: Inputs.controls(request({"X-MemT-Memory": "off"}), {"memt_memory": "auto"}))[2] == "X-MemT-Memory"
    assert refusal(lambda: Inputs.controls(request(), {"memt_memory": "sometimes"}))[2] == "metadata.memt_memory"
    assert refusal(lambda: Inputs.controls(request(), {"memt_memory": 1}))[2] == "metadata.memt_memory"
    assert refusal(lambda: Inputs.controls(request({"Idempotency-Key": "k" * 256})))[2] == "Idempotency-Key"
    assert not Inputs.controls(request({"x-stainless-retry-count": "0"})).retry


def test_a_body_is_read_within_its_bounds_and_validated_naming_the_field():
    inputs = Inputs(max_request_bytes=64)
    assert asyncio.run(inputs.model(request(body=b'{"name": "a", "size": 2}'), Body)) == Body(name="a", size=2)
    assert asyncio.run(inputs.model(request(), Body, empty=Body(name="none"))) == Body(name="none")  # no body where one may be left out
    assert refusal(lambda: inputs.model(request(body=b'{"name": "' + b"a" * 80 + b'"}'), Body))[:2] == (413, "request_too_large")
    assert refusal(lambda: inputs.model(request(body=b'{"name": '), Body))[:2] == (400, "invalid_json")
    assert refusal(lambda: inputs.model(request(body=b'{"name": "a", "size": "big"}'), Body)) == (400, None, "size")
    assert refusal(lambda: inputs.model(request(body=b'{"name": "a", "other": 1}'), Body)) == (400, None, "other")


def test_the_openapi_body_inlines_the_models_schema():
    class Outer(BaseModel):
        inner: Body

    schema = request_body(Outer, required=False)["requestBody"]
    assert schema["required"] is False
    assert schema["content"]["application/json"]["schema"]["properties"]["inner"]["properties"]["name"] == {"title": "Name", "type": "string"}


def test_sse_frames_end_in_done_with_an_error_frame_before_it():
    async def chunks(fail):
        yield {"n": 1}
        if fail is not None:
            raise fail

    async def frames(fail):
        seen = []
        return [frame async for frame in sse(chunks(fail), seen.append)], seen

    clean, none = asyncio.run(frames(None))
    assert clean == [{"data": json.dumps({"n": 1})}, {"data": "[DONE]"}] and none == []
    failed, seen = asyncio.run(frames(NotFound("gone", code="gone")))
    assert json.loads(failed[1]["data"])["error"]["code"] == "gone" and failed[-1] == {"data": "[DONE]"} and len(seen) == 1
    native, mapped = asyncio.run(frames(MemTClientError("upstream failed", stage="query", status=503)))
    assert json.loads(native[1]["data"])["error"]["message"] and native[-1] == {"data": "[DONE]"} and mapped[0].status == 503


def test_a_requests_context_is_built_once_from_its_body_and_controls():
    body = Body(name="a", size=3)
    dumped = body.model_dump_json()
    context = request_context("t", body, Controls(memory="read", idempotency_key="k", retry=True), "auto")
    assert (context.tenant, context.policy, context.size, context.digest, context.retry, context.key) == ("t", "read", len(dumped), request_digest(dumped), True, "k")
    default = request_context("t", body, Controls(), "OFF")  # no control: the proxy's --memory
    assert default.policy == "off" and not default.retry and default.key is None
    assert request_context("t", Body(name="b", size=3), Controls(), "auto").digest != context.digest
