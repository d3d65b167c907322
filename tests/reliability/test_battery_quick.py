"""The reliability battery of issue 13 at its quick size (``scripts/reliability.sh --quick``), for CI.

One run of every check against live servers (a tiny-checkpoint core and proxies on 127.0.0.1):
schemathesis on both OpenAPI documents, the hostile cases, large requests, two tenants, concurrent
sessions, the openai SDK's retries (a restarted proxy, a Responses conversation), who may drain a proxy,
kill -9 of the proxy (mid-conversation, in front of a full core) and of the core, distinct sessions past
the core's capacity. Each check
is reported as its own test, with its figures when it fails. The full battery (``scripts/reliability.sh``)
runs the same checks at the sizes the issue asks for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.reliability.battery import run  # noqa: E402

pytestmark = pytest.mark.timeout(600)
CHECKS = [
    "fuzz_proxy", "fuzz_core", "hostile", "large_body", "tiny_messages", "control_tokens", "context_overflow", "spec_strict", "two_tenants", "concurrent_sessions", "responses_retry", "restart_retry",
    "drain_auth", "kill_proxy", "restart_capacity", "distinct_sessions", "kill_core", "core_disk", "proxy_disk", "headerless_load",
    "cut_streams", "responses_restart", "crash_behind_answers", "tenant_timing",
]


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    return run(quick=True, workdir=tmp_path_factory.mktemp("battery"))


@pytest.mark.parametrize("check", CHECKS)
def test_check(battery, check):
    figures = battery[check]
    assert figures["ok"], json.dumps(figures, indent=2)[:4000]
