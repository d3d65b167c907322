"""The MemT objects of a demo checkpoint's config.json, shared by both demo families' skeletons."""

from __future__ import annotations


def memory_config(shape) -> dict:
    """The ``memt`` and ``memt_runtime`` objects of a demo checkpoint with ``shape``'s memory (a ``ModelShape``)."""
    return {
        "memt": {
            "chunk_tokens": shape.chunk_tokens,
            "memory_layers": list(shape.memory_layers),
            "num_heads": shape.memory_heads,
            "key_dim": shape.key_dim,
            "value_dim": shape.value_dim,
            "update_rule": "gated_delta",
            "state_dtype": "float32",
        },
        "memt_runtime": {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256},
    }
