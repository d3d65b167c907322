"""OpenAI-shaped errors of the proxy, and the one mapping from native MemT errors to them.

Body: ``{"error": {"message", "type", "param", "code"}}``; a message never carries more than
``MAX_MESSAGE`` characters (it may quote the client's input). Native statuses map as
400 → invalid_request_error, 401 → authentication_error, 409 → conflict, 429 → rate_limit_error,
502/503 (and an unreachable upstream) → upstream_error; an upstream that took longer than the proxy's
``--timeout`` is a 504 ``upstream_timeout``; a full or read-only state directory, the upstream's or the proxy's
own, is a 507 ``insufficient_storage`` (type ``server_error``). The proxy's own statuses: 408 (a client too slow
to send its body), 413 (a body over ``--max-request-bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging

from memt_core.errors import MemTError

log = logging.getLogger("memt.proxy")

MAX_MESSAGE = 2000

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    409: "conflict",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "upstream_error",
    500: "server_error",
    504: "upstream_error",
    507: "server_error",
}


class ProxyError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None):
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"… ({len(message) - MAX_MESSAGE} more characters)"
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or TYPES.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequest(ProxyError):
    """400: the request is malformed or asks for something this proxy does not do."""

    status_code = 400

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None):
        super().__init__(self.status_code, message, param=param, code=code, type=type)


class Unauthorized(BadRequest):
    """401: no API key, or one the proxy does not know."""

    status_code = 401


class Forbidden(BadRequest):
    """403: a known key that may not do this (a tenant's key on operator routes)."""

    status_code = 403


class NotFound(BadRequest):
    """404: no such session, snapshot, response or conversation for this tenant."""

    status_code = 404


class BodyTimeout(BadRequest):
    """408: the client did not send its body in time."""

    status_code = 408


class Conflict(BadRequest):
    """409: the request contradicts the session's state (divergence, a busy or expired state)."""

    status_code = 409


class TooLarge(BadRequest):
    """413: the body is over --max-request-bytes."""

    status_code = 413


class RateLimited(BadRequest):
    """429: no room now (sessions, states); retry later."""

    status_code = 429


class InternalError(BadRequest):
    """500: a bug no handler expected (the last resort's answer, ``memt_core.server.last_resort``)."""

    status_code = 500


class BadGateway(BadRequest):
    """502: the upstream answered something that is not its protocol."""

    status_code = 502


class Unavailable(BadRequest):
    """503: not ready, draining, or the upstream cannot serve now."""

    status_code = 503


class UpstreamTimeout(BadRequest):
    """504: the upstream did not answer within --timeout."""

    status_code = 504


class InsufficientStorage(BadRequest):
    """507: a state directory is full or read-only (the upstream's, or this proxy's own ``--state-directory``), so
    what the request must keep could not be written; nothing was acknowledged. Retry once there is room."""

    status_code = 507


BY_STATUS = {cls.status_code: cls for cls in (BadRequest, Unauthorized, Forbidden, NotFound, BodyTimeout, Conflict, TooLarge, RateLimited, InternalError, BadGateway, Unavailable, UpstreamTimeout, InsufficientStorage)}


#: OS errors of a directory that cannot take a file: full, or not writable
NO_ROOM = {errno.ENOSPC: "is full", errno.EDQUOT: "is over its disk quota", errno.EROFS: "is read-only",
           errno.EACCES: "is not writable", errno.EPERM: "is not writable"}


@contextlib.contextmanager
def kept_on_disk(what: str):
    """Map the proxy's own state directory refusing a write of ``what`` (full, read-only) to a 507: the request that
    needed it is not acknowledged, and nothing it would have kept is kept; other OS errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        log.warning("the state directory refused %s: %s", what, exc)  # the path for the operator, not the client
        raise InsufficientStorage(
            f"the proxy's state directory {NO_ROOM[exc.errno]}: {what} could not be written, so nothing was kept; "
            "retry once there is room", code="insufficient_storage",
        ) from exc


def from_native(exc: MemTError) -> ProxyError:
    """Translate a native (client or server) MemT error."""
    if _timed_out(exc):
        return UpstreamTimeout(f"upstream MemT server did not answer in time (the proxy's --timeout): {getattr(exc, 'stage', None) or 'request'}", code="upstream_timeout")
    status = getattr(exc, "status", 503) or 503
    if status not in TYPES or status in (404, 408, 413, 500, 504):  # 408/500/504 are the proxy's own answers
        status = 503 if status >= 500 else 400
    codes = {409: "session_conflict", 429: "rate_limit_exceeded", 502: "upstream_invalid_response", 503: "upstream_unavailable", 507: "insufficient_storage"}
    message = exc.message if hasattr(exc, "message") else str(exc)
    return BY_STATUS[status](f"upstream MemT server: {message}", code=codes.get(status))


def _timed_out(exc: BaseException) -> bool:
    """Whether a native client error was caused by the upstream not answering within the client's timeout."""
    cause = exc.__cause__
    while cause is not None:
        if type(cause).__name__ in ("ConnectionTimeoutError", "ConnectTimeout"):
            return False  # never reached the upstream: 503 unavailable, not 504
        if isinstance(cause, (TimeoutError, asyncio.TimeoutError)) or type(cause).__name__ in ("ReadTimeout", "ServerTimeoutError", "SocketTimeoutError"):
            return True
        cause = cause.__cause__
    return False
