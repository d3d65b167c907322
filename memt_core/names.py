"""The grammar of names a client chooses: session IDs, transaction names, RID nonces, snapshot files.

Shared by the protocol (which validates requests) and the snapshot store (which maps names to files),
so neither imports the other.
"""

from __future__ import annotations

import re
from typing import Any

from memt_core.errors import InvalidRequest

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,160}$")
SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,194}\.safetensors$")


def check_snapshot_name(value: Any) -> str:
    """Snapshot files are simple ``.safetensors`` names inside the server's state directory."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest("'file' must be a nonempty snapshot file name")
    if "/" in value or "\\" in value or ".." in value or value.startswith("."):
        raise InvalidRequest(f"snapshot name {value!r} must be a simple file name (no paths, '..', or hidden names)")
    if not SNAPSHOT_NAME.fullmatch(value):
        raise InvalidRequest(f"snapshot name {value!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]* and end with '.safetensors'")
    return value


def check_name(value: Any, what: str) -> str:
    """Session IDs, transaction names and RID nonces share one grammar: ``[A-Za-z0-9_.-]{1,160}``."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise InvalidRequest(f"{what} must match [A-Za-z0-9_.-]{{1,160}}, got {value!r}")
    return value
