"""Prometheus metrics of the proxy (``GET /metrics``, text exposition format, behind the API key as the
core's is): HTTP requests and their latency by route, tokens in and out, prompt tokens memory saved,
sessions, and errors of the upstream MemT server by kind.

* ``memt_proxy_requests_total{route,method,status}`` and ``memt_proxy_request_duration_seconds{route,method}``
  — every HTTP request, counted once its response is over (a stream's whole length is its latency).
  ``route`` is the route's template (``/v1/memt/sessions/{session}``), ``other`` for unknown paths.
* ``memt_proxy_completions_total{memory}``, ``memt_proxy_prompt_tokens_total{memory}``,
  ``memt_proxy_completion_tokens_total{memory}``, ``memt_proxy_memory_saved_tokens_total`` — from
  ``ChatService.on_usage``, once per finished chat completion; ``memory`` is "true" when memory was read.
* ``memt_proxy_sessions`` (states the proxy keeps), ``memt_proxy_sessions_in_use``,
  ``memt_proxy_sessions_leased``, and ``memt_proxy_session_offloads_total`` / ``…_restores_total`` /
  ``…_dropped_total``, ``memt_proxy_memory_writes_total`` (memory changes published: commits, restores,
  resets), ``memt_proxy_memory_states`` (kept conversation states a resent transcript can resume) and
  ``memt_proxy_memory_states_closed_total`` — read from the session layer at scrape time.
* ``memt_proxy_upstream_errors_total{kind}`` — errors that came from the upstream (unavailable, timed out,
  invalid answer, its conflicts and rate limits), by their OpenAI error ``code``, whether answered as an
  HTTP error or as an error frame of a stream.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from memt_proxy.errors import ProxyError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: codes of errors the upstream caused, beside those of type ``upstream_error`` (see ``errors.from_native``)
UPSTREAM_CODES = {"session_conflict", "rate_limit_exceeded"}
METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}  # any other is "other": labels stay few
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def is_upstream(error: ProxyError) -> bool:
    """Whether ``error`` reports a failure or refusal of the upstream MemT server."""
    return error.type == "upstream_error" or error.code in UPSTREAM_CODES


class _SessionCollector:
    """The session layer's figures, read at scrape time (on the event loop, as every change to them is)."""

    def __init__(self, sessions):
        self.sessions = sessions

    def collect(self):
        sessions = self.sessions
        states = list(sessions.table)
        yield GaugeMetricFamily("memt_proxy_sessions", "Session states the proxy keeps", value=len(states))
        yield GaugeMetricFamily("memt_proxy_sessions_in_use", "Sessions a request holds or waits for", value=sum(s.users > 0 for s in states))
        yield GaugeMetricFamily("memt_proxy_sessions_leased", "Sessions holding an upstream lease", value=sum(s.lease is not None for s in states))
        yield GaugeMetricFamily("memt_proxy_memory_states", "Kept conversation states a resent transcript can resume", value=sessions.kept.findable())
        for name, value, text in (
            ("session_offloads", sessions.placement.offloads, "Upstream sessions offloaded to make room"),
            ("session_restores", sessions.placement.restores, "Offloaded sessions restored"),
            ("session_states_dropped", sessions.table.dropped, "Idle session states dropped to make room"),
            ("memory_writes", sessions.writes.published, "Memory changes published upstream (commits, restores, resets)"),
            ("memory_states_closed", sessions.kept.closed, "Kept conversation states closed to make room"),
        ):
            yield CounterMetricFamily(f"memt_proxy_{name}", text, value=value)


class ProxyMetrics:
    """One proxy's registry; ``render()`` is the /metrics body; ``CountRequests`` fills the request metrics."""

    def __init__(self, sessions):
        self.registry = registry = CollectorRegistry()
        registry.register(_SessionCollector(sessions))
        self.requests = Counter("memt_proxy_requests", "HTTP requests by route, method and status", ["route", "method", "status"], registry=registry)
        self.latency = Histogram(
            "memt_proxy_request_duration_seconds", "Time from a request's arrival to its response's end (a stream's whole length)",
            ["route", "method"], registry=registry, buckets=BUCKETS,
        )
        self.completions = Counter("memt_proxy_completions", "Finished chat completions", ["memory"], registry=registry)
        self.prompt_tokens = Counter("memt_proxy_prompt_tokens", "Prompt tokens sent upstream", ["memory"], registry=registry)
        self.completion_tokens = Counter("memt_proxy_completion_tokens", "Tokens generated", ["memory"], registry=registry)
        self.saved_tokens = Counter("memt_proxy_memory_saved_tokens", "Prompt tokens not sent because memory holds them", registry=registry)
        self.upstream_errors = Counter("memt_proxy_upstream_errors", "Errors of the upstream MemT server by kind", ["kind"], registry=registry)
        self.stream_errors = Counter("memt_proxy_stream_errors", "Errors sent in a stream after its 200 (an error event), by code", ["code"], registry=registry)

    def observe_usage(self, *, prompt_tokens: int, completion_tokens: int, saved_tokens: int, memory: bool) -> None:
        """``ChatService.on_usage``: one finished completion."""
        label = "true" if memory else "false"
        self.completions.labels(label).inc()
        self.prompt_tokens.labels(label).inc(prompt_tokens)
        self.completion_tokens.labels(label).inc(completion_tokens)
        self.saved_tokens.inc(saved_tokens)

    def observe_error(self, error: ProxyError) -> None:
        """An error answered to a client (as a response or a stream's error frame)."""
        if is_upstream(error):
            self.upstream_errors.labels(error.code or error.type).inc()

    def observe_stream_error(self, error: ProxyError) -> None:
        """An error sent in a stream that had begun with a 200: the access log and the request counter say 200."""
        self.stream_errors.labels(error.code or error.type).inc()
        self.observe_error(error)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountRequests:
    """ASGI middleware (``app.add_middleware(CountRequests, metrics=…)``): each HTTP request counted and
    timed once its response is over."""

    def __init__(self, app, metrics: ProxyMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), None

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except BaseException:
            status = status or 500  # the server's error handler answers 500 outside this middleware
            raise
        finally:
            route = getattr(scope.get("route"), "path", None) or "other"  # the router sets it on a match
            method = scope.get("method", "") if scope.get("method") in METHODS else "other"
            self.metrics.requests.labels(route, method, str(status or 0)).inc()  # 0: the client left before any answer
            self.metrics.latency.labels(route, method).observe(time.perf_counter() - started)
