"""OpenAI error shapes and the mapping from native MemT errors."""

from __future__ import annotations

import pytest

from memt_core.client.errors import MemTClientError
from memt_core.errors import (
    AuthenticationError, BadGeneration, CapacityExceeded, Conflict, InvalidRequest, LeaseConflict, MemTError,
    WorkerUnavailable, error_from_wire,
)
from memt_proxy.errors import ProxyError, from_native


def test_body_shape():
    error = ProxyError(400, "bad thing", param="messages", code="x")
    assert error.body() == {"error": {"message": "bad thing", "type": "invalid_request_error", "param": "messages", "code": "x"}}
    assert ProxyError(401, "m").body()["error"] == {"message": "m", "type": "authentication_error", "param": None, "code": None}
    assert ProxyError(409, "m").type == "conflict"
    assert ProxyError(429, "m").type == "rate_limit_error"
    assert ProxyError(500, "m").type == "server_error"
    assert ProxyError(400, "m", type="custom").type == "custom"


@pytest.mark.parametrize("native,status,type,code", [
    (InvalidRequest("bad"), 400, "invalid_request_error", None),
    (Conflict("c"), 409, "conflict", "session_conflict"),
    (LeaseConflict("leased"), 409, "conflict", "session_conflict"),
    (AuthenticationError("no"), 401, "authentication_error", None),
    (CapacityExceeded("full"), 429, "rate_limit_error", "rate_limit_exceeded"),
    (BadGeneration("broken"), 502, "upstream_error", "upstream_invalid_response"),
    (WorkerUnavailable("down"), 503, "upstream_error", "upstream_unavailable"),
])
def test_native_errors_map(native, status, type, code):
    for error in (native, MemTClientError(f"stage: {native.message}", stage="query", cause=native)):
        mapped = from_native(error)
        assert (mapped.status, mapped.type, mapped.code) == (status, type, code)
        assert native.message in mapped.message and mapped.message.startswith("upstream MemT server: ")


@pytest.mark.parametrize("status,expected", [(404, 400), (413, 400), (418, 400), (500, 503), (504, 503)])
def test_other_statuses_fold_into_400_or_503(status, expected):
    native = error_from_wire(status, {"error": {"message": "odd"}})
    mapped = from_native(MemTClientError("x: odd", cause=native))
    assert mapped.status == expected
    assert mapped.type == ("invalid_request_error" if expected == 400 else "upstream_error")


def test_transport_failures_are_503():
    # the native client's mapping of a refused connection / broken transport
    unreachable = MemTClientError("query: cannot connect", stage="query", status=503)
    assert (from_native(unreachable).status, from_native(unreachable).type) == (503, "upstream_error")
    # a client error without any status (e.g. epoch unknown) is an upstream failure too
    assert from_native(MemTClientError("epoch unknown", stage="epoch")).status == 503
    assert from_native(MemTError("plain")).status == 503


def test_wire_errors_rebuilt_by_status():
    """What the proxy gets from the native client: statuses map even though subclasses are not kept."""
    for status in (400, 401, 409, 429, 502, 503):
        native = error_from_wire(status, {"error": {"type": "invalid_memory_request", "message": "m"}})
        assert from_native(MemTClientError("m", cause=native)).status == status


def test_each_failure_kind_is_named_once():
    """One class per status (issue 40): each carries its status and OpenAI type, and no module of the proxy
    spells a status out where it raises."""
    import re
    from pathlib import Path

    from memt_proxy import errors

    for status, cls in errors.BY_STATUS.items():
        error = cls("why", param="p", code="c")
        assert isinstance(error, errors.ProxyError) and error.status == status
        assert error.body() == {"error": {"message": "why", "type": errors.TYPES[status], "param": "p", "code": "c"}}
    package = Path(errors.__file__).parent
    literal = re.compile(r"ProxyError\(\s*\d{3}")
    assert [str(p) for p in package.rglob("*.py") if p.name != "errors.py" and literal.search(p.read_text())] == []
