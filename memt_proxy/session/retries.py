"""Answers kept for a client's retry, and the rule that tells a retry from a regenerate (DESIGN §7).

A request repeating an answered one is a retry only when the client says so (the OpenAI SDKs'
``x-stainless-retry-count`` > 0) or repeats the ``Idempotency-Key`` the kept answer was given under; otherwise it is a
regenerate. Requests are known by their digest (``request_digest``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from memt_proxy.request_context import RequestContext

if TYPE_CHECKING:
    from memt_proxy.session.state import SessionState

RETRIES_KEPT = 1024  # answers kept for a client's retry where no session keeps them (header-less chat, Responses)


def retried(retry: bool, key: str | None, kept_key: str | None) -> bool:
    """Whether a request repeating an answered one is a client's retry: it says so (``retry``: the OpenAI SDKs'
    ``x-stainless-retry-count`` > 0), or repeats the ``Idempotency-Key`` the kept answer was given under."""
    return retry or key is not None and key == kept_key


class RetryStore(Protocol):
    """Where a turn's answer is kept for a client's retry, as the hold that planned the turn decided
    (``MemoryPlan.retries``): told when the answer is ready (``answered``) and when a commit behind it is on its way
    (``committed``: the state it lands in, and the memory version it publishes)."""

    def answered(self, context: RequestContext, answer) -> None: ...

    def committed(self, context: RequestContext, answer, state: SessionState, version: int) -> None: ...


class KeptAnswers:
    """Answers kept for a client's retry, the newest ``limit``: (tenant, request digest) → (its Idempotency-Key, answer).
    As a ``RetryStore`` (header-less turns, Responses): an answer is kept as soon as it is ready."""

    def __init__(self, limit: int = RETRIES_KEPT):
        self.limit = limit
        self._kept: OrderedDict[tuple[str, str], tuple[str | None, object]] = OrderedDict()

    def keep(self, tenant: str, digest: str, key: str | None, answer) -> None:
        self._kept[(tenant, digest)] = (key, answer)
        self._kept.move_to_end((tenant, digest))
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def retried(self, tenant: str, digest: str, retry: bool, key: str | None):
        """The answer kept for this request when it is a client's retry (``retried``), else None."""
        kept = self._kept.get((tenant, digest))
        return kept[1] if kept is not None and retried(retry, key, kept[0]) else None

    def answered(self, context: RequestContext, answer) -> None:
        self.keep(context.tenant, context.digest, context.key, answer)

    def committed(self, context: RequestContext, answer, state: SessionState, version: int) -> None:
        """(Kept already, when answered.)"""


class InSessionRecord:
    """A named session's answers (a ``RetryStore``): kept with the commit behind the answer, in the record of the state
    it lands in (``SessionState.last_turn``, saved with that commit, so a retry reaching a restarted proxy gets it too);
    an answer nothing commits is not kept (its retry is answered anew). Its retries read only that record."""

    def answered(self, context: RequestContext, answer) -> None:
        """(Kept only with a commit.)"""

    def committed(self, context: RequestContext, answer, state: SessionState, version: int) -> None:
        state.last_turn = {"digest": context.digest, "key": context.key, "version": version, **answer}


IN_SESSION_RECORD = InSessionRecord()


def request_digest(dumped: str) -> str:
    """SHA-256 of the whole request as received (its JSON dump): a client's retry of the same request has the same digest."""
    return hashlib.sha256(dumped.encode()).hexdigest()
