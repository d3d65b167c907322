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
    chunk_size: int = 32,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Chunked write (WY / UT transform): same signature and result as the reference.

    Within a chunk with cumulative log decay γ, the corrected values ``U`` solve the unit lower
    triangular system ``(I + A) U = β ⊙ (V − e^{γ} ⊙ K S₀)``, ``A[t,i] = β_t e^{γ_t−γ_i} k_t·k_i`` (i < t);
    then ``S = e^{γ_C} S₀ + Kᵀ (e^{γ_C−γ} ⊙ U)`` and ``O = (e^{γ} ⊙ Q) S₀ + (M ⊙ e^{γ_t−γ_i} Q Kᵀ) U``.
    Everything but the state hand-off between chunks is computed for all chunks at once.
    """
    batch, length, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    size = chunk_size
    state = _initial(initial_state, batch, heads, key_dim, value_dim, k.device)
    if length == 0:
        return (v.new_zeros(batch, 0, heads, value_dim).float() if q is not None else None), state

    pad = (-length) % size

    def chunks(x: torch.Tensor) -> torch.Tensor:
        # [B, T, H, D] → [N, B·H, C, D]; padded tokens have k = v = β = 0 and g = 0: they change nothing
        x = x.float()
        if pad:
            x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
        x = x.reshape(batch, -1, size, heads, x.shape[-1]).permute(1, 0, 3, 2, 4)
        return x.reshape(x.shape[0], batch * heads, size, x.shape[-1]).contiguous()

    k_c, v_c = chunks(k), chunks(v)
    g_c, beta_c = chunks(g[..., None])[..., 0], chunks(beta[..., None])[..., 0]  # [N, B·H, C]
    gamma = g_c.cumsum(-1)  # γ_t within each chunk

    lower = torch.ones(size, size, dtype=torch.bool, device=k.device).tril()
    # e^{γ_t − γ_i} for i ≤ t, zero above the diagonal (masked before exp so it never overflows)
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")).exp()

    # T = (I + A)^{-1}: a unit lower triangular solve (out of place, so autograd can differentiate it)
    eye = torch.eye(size, device=k.device)
    a = (beta_c[..., :, None] * decay * (k_c @ k_c.transpose(-1, -2))).tril(-1)
    t = torch.linalg.solve_triangular(a + eye, eye.expand_as(a), upper=False, unitriangular=True)
    wu = t @ torch.cat([(beta_c * gamma.exp())[..., None] * k_c, beta_c[..., None] * v_c], dim=-1)
    w, u = wu[..., :key_dim].contiguous(), wu[..., key_dim:].contiguous()  # U = u − w S₀ once S₀ is known
    k_tail = (k_c * (gamma[..., -1:] - gamma).exp()[..., None]).transpose(-1, -2).contiguous()  # Kᵀ e^{γ_C−γ}
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # e^{γ_C}

    if q is not None:
        q_c = chunks(q)
        attn = (q_c @ k_c.transpose(-1, -2)) * decay
        q_decayed = q_c * gamma.exp()[..., None]
    s = state.reshape(batch * heads, key_dim, value_dim)
    outputs = []
    for n in range(k_c.shape[0]):
        u_n = torch.baddbmm(u[n], w[n], s, alpha=-1.0)
        if q is not None:
            outputs.append(torch.baddbmm(attn[n] @ u_n, q_decayed[n], s))
        s = torch.baddbmm(chunk_decay[n] * s, k_tail[n], u_n)
    state = s.reshape(batch, heads, key_dim, value_dim)
    if q is None:
        return None, state
    out = torch.stack(outputs).reshape(-1, batch, heads, size, value_dim).permute(1, 0, 3, 2, 4)
    return out.reshape(batch, -1, heads, value_dim)[:, :length].contiguous(), state


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
