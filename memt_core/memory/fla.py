"""flash-linear-attention's Triton gated delta rule, used for the write on CUDA when installed.

FLA's ``chunk_gated_delta_rule`` follows the same recurrence as ``gated_delta.recurrent_gated_delta_rule``
with ``α = exp(g)``; we pass ``scale=1`` so its output is ``S_tᵀ q_t`` like ours. The package
(``fla-core``) comes with the ``sglang`` extra and is never vendored.
"""

from __future__ import annotations

import importlib.util

import torch


def available() -> bool:
    """True when the ``fla`` package can be imported and a CUDA device exists."""
    return torch.cuda.is_available() and importlib.util.find_spec("fla") is not None


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None):
    """FLA's kernel behind our signature (shapes as in ``memt_core.memory.gated_delta``)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as kernel

    if q is None:
        q = torch.zeros_like(k)
    out, final = kernel(
        q.float().contiguous(),
        k.float().contiguous(),
        v.float().contiguous(),
        g.float().contiguous(),
        beta.float().contiguous(),
        scale=1.0,
        initial_state=None if initial_state is None else initial_state.float().contiguous(),
        output_final_state=True,
    )
    return out, final


def write(k, v, g, beta, initial_state=None) -> torch.Tensor:
    """Fold tokens into a state with FLA; returns the new ``[B, H, K, V]`` state."""
    return chunk_gated_delta_rule(None, k, v, g, beta, initial_state)[1]
