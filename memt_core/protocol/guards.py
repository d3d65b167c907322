"""The guards every action checks on one session before the machine plans it, and the settling of receipts of unknown
outcome: rules over one ``Session``'s state, no I/O (``memt_core.protocol.machine`` calls them).

* ``require_idle``: no request in flight (a control action waits until it finishes or is cancelled);
* ``open_transaction``: the session's open transaction, by name;
* ``require_certain``: no work of unknown outcome (status and recover come first);
* ``resolve_unknown``: receipts of unknown outcome settled by the engine's answer (recover, release with reconcile).
"""

from __future__ import annotations

from memt_core.errors import SessionBusy, TransactionConflict, UncertainSession
from memt_core.protocol.state import APPLIED, FAILED, UNKNOWN, Session, Transaction


def require_idle(session: Session, what: str) -> None:
    if session.in_flight:
        raise SessionBusy(f"session {session.id!r} has a request in flight; {what} waits until it finishes or is cancelled")


def open_transaction(session: Session, name: str) -> Transaction:
    txn = session.transaction
    if txn is None:
        raise TransactionConflict(f"session {session.id!r} has no open transaction (named {name!r})")
    if txn.name != name:
        raise TransactionConflict(f"session {session.id!r} has open transaction {txn.name!r}, not {name!r}")
    return txn


def require_certain(session: Session) -> None:
    if session.uncertain:
        raise UncertainSession(
            f"session {session.id!r} has work of unknown outcome; call status and recover before further writes"
        )


def resolve_unknown(session: Session, txn: Transaction | None, landed: set[str] | None) -> None:
    """Settle receipts of unknown outcome: from the engine's answer for the open transaction
    (``landed``), as failed for transactions that ended (nothing of them can publish)."""
    for receipt in txn.commits if (txn and landed is not None) else ():
        if receipt.status == UNKNOWN:
            receipt.status = APPLIED if receipt.nonce in landed else FAILED
    for old in session.history.values():
        for receipt in old.commits:
            if receipt.status == UNKNOWN:
                receipt.status = FAILED
    session.uncertain = False
