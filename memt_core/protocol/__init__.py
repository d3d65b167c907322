"""The memt-http-v1 protocol as a state machine without I/O: events in, plans and tickets out.

``parse_control`` / ``parse_generate`` validate wire bodies into events; ``MemTProtocol`` holds the
sessions of one server epoch and decides what is legal. See ``machine`` for the rules.
"""

from memt_core.protocol.effects import Effect
from memt_core.protocol.events import (
    Action,
    Commit,
    Create,
    PlainGeneration,
    Query,
    Rid,
    action_name,
    check_name,
    check_snapshot_name,
    is_memt_rid,
    parse_control,
    parse_generate,
    parse_rid,
)
from memt_core.protocol.machine import APPLIED, FAILED, UNKNOWN, Limits, MemTProtocol, Plan, Ticket

__all__ = [
    "APPLIED", "FAILED", "UNKNOWN", "Action", "Commit", "Create", "Effect", "Limits", "MemTProtocol", "PlainGeneration",
    "Plan", "Query", "Rid", "Ticket", "action_name", "check_name", "check_snapshot_name",
    "is_memt_rid", "parse_control", "parse_generate", "parse_rid",
]
