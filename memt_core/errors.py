"""Every MemT failure kind, one class each, shared by the server, the client and the proxy.

The HTTP status of a failure is chosen here and nowhere else::

    MemTError                         base class; .status, .wire_type, .message
    ├── InvalidRequest          400   malformed or illegal input; nothing was changed
    │   └── SnapshotError       400   a snapshot file that fails the memt-memory-v1 checks
    ├── Conflict                409   the request does not fit the session's state
    │   ├── UnknownSession            no such session (or it was closed)
    │   ├── SessionExists             create with an ID already in use
    │   ├── LeaseConflict             missing, wrong, expired or foreign lease
    │   ├── EpochMismatch             the request names another server epoch
    │   ├── SessionBusy               work in flight forbids the action
    │   ├── TransactionConflict       no / another / already-open transaction
    │   ├── NonceReused               a RID nonce the session has seen before
    │   ├── UncertainSession          unreconciled work of unknown outcome
    │   ├── OwnershipConflict         another server owns the session (or fenced this one out)
    │   └── RouteDisabled             an admin route this server does not offer
    ├── AuthenticationError     401   missing or wrong API key
    ├── RequestTimeout          408   the request body did not arrive in time
    ├── PayloadTooLarge         413   a request body over the server's limit; nothing was read into memory
    ├── CapacityExceeded        429   session or in-flight commit limit reached
    ├── BadGeneration           502   the engine returned an incomplete or invalid result
    ├── WorkerUnavailable       503   the engine could not be reached; the session may be uncertain
    │   └── EngineBusy                queries waiting for admission are at the server's bound (Retry-After)
    └── InsufficientStorage     507   the state directory is full or read-only; the file was not written

``CheckpointError`` is separate: it refuses a checkpoint at load time and never reaches the wire.
"""

from __future__ import annotations

import re

WIRE_TYPE = "invalid_memory_request"


#: longest message an error carries; messages quote client input, which must not come back whole
MAX_MESSAGE = 2000


class MemTError(Exception):
    """Base of every protocol-level failure; carries its HTTP status and wire type."""

    status: int = 500
    wire_type: str = WIRE_TYPE

    def __init__(self, message: str):
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + f"… ({len(message) - MAX_MESSAGE} more characters)"
        super().__init__(message)
        self.message = message

    @classmethod
    def code(cls) -> str:
        """The failure kind on the wire: the class name in snake case (``session_exists``, ``lease_conflict``)."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()

    def to_wire(self) -> dict:
        """The error body the server sends: ``{"error": {"type", "message", "code"}}``."""
        return {"error": {"type": self.wire_type, "message": self.message, "code": self.code()}}


class InvalidRequest(MemTError):
    """Bad request parameters (400)."""

    status = 400


class SnapshotError(InvalidRequest):
    """A snapshot file that is not a valid memt-memory-v1 file for this model (400)."""


class Conflict(MemTError):
    """The request conflicts with the session's current state (409)."""

    status = 409


class UnknownSession(Conflict):
    """The named session does not exist."""


class SessionExists(Conflict):
    """A session with this ID already exists."""


class LeaseConflict(Conflict):
    """The lease is missing, wrong, expired, or held by someone else."""


class EpochMismatch(Conflict):
    """The request belongs to another server epoch (the server restarted)."""


class SessionBusy(Conflict):
    """Work in flight on the session forbids this action now."""


class TransactionConflict(Conflict):
    """The transaction named does not match the session's open transaction."""


class NonceReused(Conflict):
    """A request ID nonce that this session has already seen; it is never applied twice."""


class UncertainSession(Conflict):
    """Earlier work on the session has an unknown outcome; reconcile with status/recover first."""


class OwnershipConflict(Conflict):
    """Another server owns the session, or a newer owner fenced this server's write out."""


class RouteDisabled(Conflict):
    """An administrative route that this server keeps disabled."""


class AuthenticationError(MemTError):
    """Missing or wrong API key (401)."""

    status = 401
    wire_type = "authentication_error"


class RequestTimeout(MemTError):
    """A request body that did not arrive within the server's time (408)."""

    status = 408


class PayloadTooLarge(MemTError):
    """A request body longer than the server accepts (413)."""

    status = 413


class CapacityExceeded(MemTError):
    """Session or concurrent-commit capacity is exhausted (429)."""

    status = 429


class BadGeneration(MemTError):
    """The engine produced an incomplete or invalid result (502)."""

    status = 502


class WorkerUnavailable(MemTError):
    """The engine could not be reached or did not acknowledge in time (503)."""

    status = 503


class EngineBusy(WorkerUnavailable):
    """The queue of queries waiting for admission is full (``--max-queued-requests``): nothing was started; retry after
    ``retry_after`` seconds (503 with ``Retry-After``)."""

    retry_after = 1


class InsufficientStorage(MemTError):
    """A file the request needs written did not fit: the state directory is full or read-only (507).
    Nothing was written and the session is unchanged; retry once the operator has made room."""

    status = 507


class CheckpointError(ValueError):
    """A checkpoint directory that this project refuses to load; the message names the field."""


_BY_STATUS = {
    400: InvalidRequest,
    401: AuthenticationError,
    408: RequestTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    429: CapacityExceeded,
    502: BadGeneration,
    503: WorkerUnavailable,
    507: InsufficientStorage,
}


def _kinds(cls: type[MemTError]) -> dict[str, type[MemTError]]:
    found = {cls.code(): cls}
    for sub in cls.__subclasses__():
        found.update(_kinds(sub))
    return found


def error_from_wire(status: int, body: object) -> MemTError:
    """Rebuild the typed error for an HTTP error answer (used by the client): the class its ``code`` names."""
    message = f"HTTP {status}"
    code = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message") or message)
        code = body["error"].get("code")
    elif isinstance(body, dict) and "detail" in body:
        message = str(body["detail"])
    cls = _kinds(MemTError).get(code) if isinstance(code, str) else None
    if cls is None or cls.status != status:
        cls = _BY_STATUS.get(status, MemTError)
    error = cls(message)
    if cls is MemTError:
        error.status = status
    return error
