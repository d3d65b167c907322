"""Prometheus metrics of one server: sessions, leases, commits, write events, tokens, latencies."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from memt_core.server.service import MemTService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector:
    """Reads the protocol's and engine's current figures at scrape time."""

    def __init__(self, service: MemTService):
        self.service = service

    def collect(self):
        service = self.service
        counts = service.protocol.counts(service.clock())
        for name, help_text in (
            ("sessions", "Sessions that exist"),
            ("leases", "Sessions with a valid lease"),
            ("open_transactions", "Sessions with an open transaction"),
            ("inflight_commits", "Commits being executed"),
            ("uncertain_sessions", "Sessions with work of unknown outcome"),
        ):
            yield GaugeMetricFamily(f"memt_{name}", help_text, value=counts[name])
        stats = service.engine.stats
        yield GaugeMetricFamily("memt_running_requests", "Queries being decoded", value=stats.running)
        yield GaugeMetricFamily("memt_waiting_requests", "Queries waiting for a decode slot", value=stats.waiting)
        yield GaugeMetricFamily("memt_queued_requests", "Queries accepted and not yet admitted (bounded by --max-queued-requests)", value=stats.queued)
        yield GaugeMetricFamily("memt_kv_reserved_tokens", "KV tokens the running queries reserved (against --max-total-tokens)", value=stats.kv_reserved)
        if stats.kv_budget is not None:
            yield GaugeMetricFamily("memt_kv_budget_tokens", "The KV budget (--max-total-tokens)", value=stats.kv_budget)
        if stats.kv_held_peak is not None:
            yield GaugeMetricFamily("memt_kv_held_peak_tokens", "The most KV tokens the caches held after a step (measured)", value=stats.kv_held_peak)
        for name, value, help_text in (
            ("commits", stats.commits, "Commits applied to transaction candidates"),
            ("write_events", stats.write_events, "Memory write events (per memory layer)"),
            ("commit_tokens", stats.commit_tokens, "Tokens written by commits"),
            ("prompt_tokens", stats.prompt_tokens, "Prompt tokens prefilled for queries"),
            ("generation_tokens", stats.generated_tokens, "Tokens generated"),
            ("decode_steps", stats.decode_steps, "Decode steps run (batched)"),
            ("refused_queue_full", stats.refused_queue_full, "Queries refused with 503 beyond --max-queued-requests"),
        ):
            yield CounterMetricFamily(f"memt_{name}", help_text, value=value)
        control = CounterMetricFamily("memt_control_requests", "Control actions by action and HTTP status", labels=["action", "status"])
        for (action, status), value in sorted(service.counters.control.items()):
            control.add_metric([action, str(status)], value)
        yield control
        requests = CounterMetricFamily("memt_generate_requests", "Generation requests by kind and HTTP status", labels=["kind", "status"])
        for (kind, status), value in sorted(service.counters.requests.items()):
            requests.add_metric([kind, str(status)], value)
        yield requests


class Metrics:
    """A registry for one service; ``render()`` is the /metrics body."""

    def __init__(self, service: MemTService):
        self.registry = CollectorRegistry()
        self.registry.register(_StateCollector(service))
        self.latency = Histogram(
            "memt_request_latency_seconds", "Latency of control actions, queries and commits",
            ["kind"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        service.observers.append(lambda kind, seconds: self.latency.labels(kind).observe(seconds))

    def render(self) -> bytes:
        return generate_latest(self.registry)
