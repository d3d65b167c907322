"""``MemTClientError``: every failure the client reports, with what is known of its outcome."""

from __future__ import annotations

from memt_core.errors import MemTError


class MemTClientError(MemTError):
    """A client operation failed.

    ``uncertain``: the request may or may not have changed server state (the connection broke after
    it was sent); inspect ``status()`` and ``recover()`` before writing again, never replay blindly.
    ``stage``: the request that failed (``"commit"``, ``"publish"``, ``"query"``, …).
    ``transaction``: the transaction in progress, if any. ``answer``: a reply that completed before
    the failure (e.g. the chat answer when its commit failed). ``status`` and ``cause``: the server's
    HTTP status and typed error, when the server answered.
    """

    def __init__(
        self,
        message: str,
        *,
        uncertain: bool = False,
        stage: str | None = None,
        transaction: str | None = None,
        answer=None,
        status: int | None = None,
        cause: MemTError | None = None,
    ):
        super().__init__(message)
        self.uncertain = uncertain
        self.stage = stage
        self.transaction = transaction
        self.answer = answer
        self.cause = cause
        if status is not None:
            self.status = status
        elif cause is not None:
            self.status = cause.status

    def with_context(self, *, transaction: str | None = None, answer=None) -> "MemTClientError":
        """Add what the caller knows (transaction, completed answer) and return self for re-raising."""
        if transaction is not None and self.transaction is None:
            self.transaction = transaction
        if answer is not None and self.answer is None:
            self.answer = answer
        return self
