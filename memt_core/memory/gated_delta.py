"""The gated delta rule: how tokens are written into a memory state, and how a state is read.

Per head, with state ``S ∈ R^{K×V}``, decay ``α_t = exp(g_t)`` and write strength ``β_t``::

    S_t = α_t S_{t-1} + β_t k_t (v_t − α_t S_{t-1}ᵀ k_t)ᵀ        (write)
    o_t = S_tᵀ q_t                                               (output of the write kernel)
    y_t = S_readᵀ q_t                                            (read of a fixed snapshot)

``recurrent_gated_delta_rule`` is the token-by-token reference; ``chunk_gated_delta_rule`` computes
the same thing a chunk at a time in WY form. Tests hold them equal. Shapes, for both::

    q, k: [B, T, H, K]   v: [B, T, H, V]   g, beta: [B, T, H]   initial_state: [B, H, K, V]
    → o: [B, T, H, V] (None when q is None), final_state: [B, H, K, V]

``g`` is the log decay (≤ 0), as in flash-linear-attention, so the FLA kernel can be swapped in.
All arithmetic runs in float32 whatever the input dtype.
"""

from __future__ import annotations

import torch

#: Tokens per chunk of the chunked write (the fastest on CPU for small and Nano-sized heads alike).
CHUNK_SIZE = 32
#: The chunk-local work (everything but the state recurrence) is done for several chunks at once while
#: their temporaries stay about this size: small heads then cost a few large ops instead of many small
#: ones, and large heads (one chunk already this big) keep every temporary in cache.
BLOCK_BYTES = 1 << 20


def read_memory(q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Read a fixed state: ``y_t = Sᵀ q_t``. q: [B, T, H, K], state: [B, H, K, V] → [B, T, H, V]."""
    return torch.einsum("bthk,bhkv->bthv", q.float(), state.float())


def recurrent_gated_delta_rule(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Reference write: one token at a time, exactly the recurrence in the module docstring."""
    batch, length, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    k, v, g, beta = k.float(), v.float(), g.float(), beta.float()
    state = _initial(initial_state, batch, heads, key_dim, value_dim, k.device)
    outputs = []
    for t in range(length):
        alpha = g[:, t].exp()[..., None, None]  # [B, H, 1, 1]
        k_t, v_t, b_t = k[:, t], v[:, t], beta[:, t][..., None]  # [B,H,K], [B,H,V], [B,H,1]
        state = alpha * state
        predicted = torch.einsum("bhkv,bhk->bhv", state, k_t)  # α_t S_{t-1}ᵀ k_t
        state = state + torch.einsum("bhk,bhv->bhkv", k_t, b_t * (v_t - predicted))
        if q is not None:
            outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t].float()))
    out = torch.stack(outputs, dim=1) if q is not None and outputs else None
    if q is not None and out is None:
        out = v.new_zeros(batch, 0, heads, value_dim)
    return out, state


def chunk_gated_delta_rule(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Chunked write (WY / UT transform): same signature and result as the reference.

    Within a chunk with cumulative log decay γ, the corrected values ``U`` solve the unit lower
    triangular system ``(I + A) U = β ⊙ (V − e^{γ} ⊙ K S₀)``, ``A[t,i] = β_t e^{γ_t−γ_i} k_t·k_i`` (i < t);
    then ``S = e^{γ_C} S₀ + Kᵀ (e^{γ_C−γ} ⊙ U)`` and ``O = (e^{γ} ⊙ Q) S₀ + (M ⊙ e^{γ_t−γ_i} Q Kᵀ) U``.
    Everything that does not depend on ``S₀`` is computed for a block of chunks at once (see
    ``BLOCK_BYTES``); only the state recurrence runs chunk by chunk. The last chunk is padded with
    tokens that write nothing (k = v = β = 0, g = 0). Without autograd the state is updated in place.
    """
    batch, length, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    state = _initial(initial_state, batch, heads, key_dim, value_dim, k.device)
    if length == 0:
        return (v.new_zeros(batch, 0, heads, value_dim).float() if q is not None else None), state
    rows, size = batch * heads, chunk_size
    inputs = (q, k, v, g, beta, initial_state)
    in_place = not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs))
    s = state.reshape(rows, key_dim, value_dim)
    if in_place:
        s = s.clone()  # never write into the caller's initial state
    per_chunk = 4 * rows * size * (size + 2 * key_dim + 2 * value_dim + (key_dim if q is not None else 0))
    block = size * max(1, BLOCK_BYTES // per_chunk)  # tokens per block of chunk-local work
    eye = torch.eye(size, device=k.device)
    above = torch.ones(size, size, dtype=torch.bool, device=k.device).triu(1)
    outputs = []
    for start in range(0, length, block):
        stop = min(start + block, length)
        chunks = -(-(stop - start) // size)
        k_n, v_n = _blocked(k, start, stop, size), _blocked(v, start, stop, size)  # [N, B·H, C, K], [N, B·H, C, V]
        beta_n = _blocked(beta[..., None], start, stop, size)[..., 0]  # [N, B·H, C]
        gamma = _blocked(g[..., None], start, stop, size)[..., 0].cumsum(-1)  # γ_t within each chunk
        # e^{γ_t − γ_i} for i ≤ t, zero above the diagonal (masked before exp so it never overflows)
        decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(above, float("-inf")).exp()
        # T = (I + A)^{-1}: a unit lower triangular solve (out of place, so autograd can differentiate it)
        a = (beta_n[..., :, None] * decay * (k_n @ k_n.transpose(-1, -2))).tril(-1)
        t = torch.linalg.solve_triangular(a, eye.expand_as(a), upper=False, unitriangular=True)
        w = t @ ((beta_n * gamma.exp())[..., None] * k_n)  # W, so that U = T β V − W S₀
        u_base = t @ (beta_n[..., None] * v_n)
        last = gamma[..., -1:]  # γ_C
        k_tail = (k_n * (last - gamma).exp()[..., None]).transpose(-1, -2)  # Kᵀ e^{γ_C−γ}
        chunk_decay = last.exp()[..., None]  # e^{γ_C}: [N, B·H, 1, 1]
        if q is not None:
            q_n = _blocked(q, start, stop, size)
            attn = (q_n @ k_n.transpose(-1, -2)) * decay
            q_decayed = q_n * gamma.exp()[..., None]
        for c in range(chunks):
            u = torch.baddbmm(u_base[c], w[c], s, alpha=-1.0)
            if q is not None:
                outputs.append(torch.baddbmm(attn[c] @ u, q_decayed[c], s))
            if in_place:
                s.mul_(chunk_decay[c]).baddbmm_(k_tail[c], u)
            else:
                s = torch.baddbmm(chunk_decay[c] * s, k_tail[c], u)
    state = s.reshape(batch, heads, key_dim, value_dim)
    if q is None:
        return None, state
    out = torch.cat(outputs, dim=1)[:, :length]  # [B·H, T, V], padding dropped
    out = out.reshape(batch, heads, length, value_dim).transpose(1, 2)
    return out.contiguous(), state


def _blocked(x: torch.Tensor, start: int, stop: int, size: int) -> torch.Tensor:
    """Tokens start:stop of [B, T, H, D] → [N, B·H, C, D] chunks of ``size`` in FP32, zero-padded to whole chunks."""
    batch, _, heads, dim = x.shape
    chunks = -(-(stop - start) // size)
    x = x[:, start:stop].float()
    if x.shape[1] < chunks * size:
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, chunks * size - x.shape[1]))
    x = x.reshape(batch, chunks, size, heads, dim).permute(1, 0, 3, 2, 4)
    return x.reshape(chunks, batch * heads, size, dim)


def _initial(state: torch.Tensor | None, batch: int, heads: int, key_dim: int, value_dim: int, device) -> torch.Tensor:
    if state is None:
        return torch.zeros(batch, heads, key_dim, value_dim, device=device, dtype=torch.float32)
    if state.shape != (batch, heads, key_dim, value_dim):
        raise ValueError(f"initial_state has shape {tuple(state.shape)}, expected {(batch, heads, key_dim, value_dim)}")
    return state.float()


def gated_delta_write(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fold tokens into a state with the fastest available kernel; returns the new state.

    On CUDA with flash-linear-attention installed, its Triton kernel runs; elsewhere the chunked
    torch implementation. Both follow the reference above.
    """
    if k.is_cuda:
        from memt_core.memory import fla

        if fla.available():
            return fla.write(k, v, g, beta, initial_state)
    return chunk_gated_delta_rule(None, k, v, g, beta, initial_state)[1]
