"""OpenAI-shaped errors of the proxy, and the one mapping from native MemT errors to them.

Body: ``{"error": {"message", "type", "param", "code"}}``. Native statuses map as
400 → invalid_request_error, 401 → authentication_error, 409 → conflict, 429 → rate_limit_error,
502/503 (and an unreachable upstream) → upstream_error.
"""

from __future__ import annotations

from memt_core.errors import MemTError

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    409: "conflict",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "upstream_error",
}


class ProxyError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or TYPES.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_native(exc: MemTError) -> ProxyError:
    """Translate a native (client or server) MemT error."""
    status = getattr(exc, "status", 503) or 503
    if status not in TYPES or status in (404, 413):
        status = 503 if status >= 500 else 400
    codes = {409: "session_conflict", 429: "rate_limit_exceeded", 502: "upstream_invalid_response", 503: "upstream_unavailable"}
    message = exc.message if hasattr(exc, "message") else str(exc)
    return ProxyError(status, f"upstream MemT server: {message}", code=codes.get(status))
