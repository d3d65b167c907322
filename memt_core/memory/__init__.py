"""The latent-memory algorithm: gated delta-rule write and read, memory states, snapshot files."""

from memt_core.memory.gated_delta import (
    chunk_gated_delta_rule,
    gated_delta_write,
    read_memory,
    recurrent_gated_delta_rule,
)
from memt_core.memory.snapshot import load_snapshot, save_snapshot, snapshot_path
from memt_core.memory.state import MemoryState

__all__ = [
    "MemoryState",
    "chunk_gated_delta_rule",
    "gated_delta_write",
    "load_snapshot",
    "read_memory",
    "recurrent_gated_delta_rule",
    "save_snapshot",
    "snapshot_path",
]
