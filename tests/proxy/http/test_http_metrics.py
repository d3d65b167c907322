"""Which errors the proxy's /metrics counts as the upstream's, including those a stream reports in an
error frame after its response began (the live test covers the HTTP ones)."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from memt_core.client.errors import MemTClientError
from memt_proxy.http.route_inputs import sse as _sse
from memt_proxy.errors import ProxyError, from_native
from memt_proxy.http.metrics import ProxyMetrics


class NoSessions:
    """The session layer's public figures, all empty (no upstream needed to count errors)."""

    table: list = []
    placement = type("Placement", (), {"offloads": 0, "restores": 0})()
    kept = type("KeptStates", (), {"closed": 0, "findable": lambda self: 0})()
    writes = type("Writes", (), {"published": 0})()


NoSessions.table = type("Table", (list,), {"dropped": 0})()


def upstream_errors(metrics: ProxyMetrics) -> dict[str, float]:
    families = text_string_to_metric_families(metrics.render().decode())
    return {s.labels["kind"]: s.value for f in families for s in f.samples if s.name == "memt_proxy_upstream_errors_total"}


def frames(metrics: ProxyMetrics, error: BaseException) -> list[str]:
    async def chunks():
        yield {"x": 1}
        raise error

    async def run():
        return [frame["data"] async for frame in _sse(chunks(), metrics.observe_error)]

    return asyncio.run(run())


@pytest.mark.parametrize("status, code", [(503, "upstream_unavailable"), (409, "session_conflict"), (429, "rate_limit_exceeded"), (502, "upstream_invalid_response")])
def test_upstream_failures_in_a_stream_are_counted_by_kind(status, code):
    metrics = ProxyMetrics(NoSessions())
    error = from_native(MemTClientError("boom", status=status))
    assert error.code == code
    sent = frames(metrics, error)
    assert json.loads(sent[1])["error"]["code"] == code and sent[-1] == "[DONE]"
    assert upstream_errors(metrics) == {code: 1.0}


def test_a_clients_mistake_is_no_upstream_error():
    metrics = ProxyMetrics(NoSessions())
    frames(metrics, ProxyError(400, "bad", code="invalid_request"))
    frames(metrics, ProxyError(429, "full", code="too_many_sessions"))  # the proxy's own limit
    assert upstream_errors(metrics) == {}


def test_a_native_error_reaching_the_stream_unmapped_is_counted_too():
    """The stream's last line of defence maps a native error itself, and counts it."""
    metrics = ProxyMetrics(NoSessions())
    sent = frames(metrics, MemTClientError("gone", status=503))
    assert json.loads(sent[1])["error"]["code"] == "upstream_unavailable"
    assert upstream_errors(metrics) == {"upstream_unavailable": 1.0}
