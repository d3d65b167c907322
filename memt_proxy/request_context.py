"""What a surface knows of a request besides its body, read once when it arrives: whose it is, its memory policy, its
size, its digest and whether the client says it retries. Frozen: built once, read everywhere after, never changed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestContext:
    """A request's context (its body is the surface's own model)."""

    tenant: str  # the API key's tenant: sessions, states and kept answers are its own
    policy: str  # memory: "auto" reads and commits, "read" only reads, "off" neither (X-MemT-Memory, else --memory)
    size: int  # characters of the request's JSON: decides where its prompt is prepared (``worker.off_loop``)
    digest: str  # SHA-256 of that JSON (``session.retries.request_digest``): an identical retry is answered again
    retry: bool = False  # the client says it sends the request again (``x-stainless-retry-count`` > 0)
    key: str | None = None  # its Idempotency-Key
