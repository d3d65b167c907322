"""The memory module that sits beside one native attention layer (DESIGN §4).

It sees the attention's normed input ``x`` and

* reads a fixed snapshot ``S``:  ``y = W_o · concat_h(g ⊙ (Sᵀ q))``, added to the attention output;
* produces what a commit writes: ``k``, ``v``, log decay ``log α`` and strength ``β`` per token.

No projection on the read path has a bias, so an all-zero memory adds exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from memt_core.memory.gated_delta import read_memory


@dataclass
class WriteInputs:
    """What one forward pass writes: ``k [B,T,H,K]``, ``v [B,T,H,V]``, ``g`` (log α) and ``beta [B,T,H]``."""

    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    def slice(self, start: int, stop: int) -> "WriteInputs":
        """Tokens ``start:stop`` (a write event's share of a commit)."""
        return WriteInputs(self.k[:, start:stop], self.v[:, start:stop], self.g[:, start:stop], self.beta[:, start:stop])

    @staticmethod
    def cat(parts: list["WriteInputs"]) -> "WriteInputs":
        """Stack along the batch dimension."""
        return WriteInputs(*(torch.cat([getattr(p, name) for p in parts], dim=0) for name in ("k", "v", "g", "beta")))

    def masked(self, mask: torch.Tensor) -> "WriteInputs":
        """Zero the writes of tokens where ``mask [B, T]`` is False (k = v = β = 0, log α = 0)."""
        keep = mask.to(self.k.dtype)
        return WriteInputs(
            self.k * keep[..., None, None], self.v * keep[..., None, None], self.g * keep[..., None], self.beta * keep[..., None]
        )

    @property
    def length(self) -> int:
        return self.k.shape[1]


class MemoryModule(nn.Module):
    """Projections of one memory layer; tensor names are documented in ``memt_core.models.weights``."""

    def __init__(self, hidden_size: int, num_heads: int, key_dim: int, value_dim: int):
        super().__init__()
        self.num_heads, self.key_dim, self.value_dim = num_heads, key_dim, value_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_heads * key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_heads * value_dim, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)  # write strength β
        self.a_proj = nn.Linear(hidden_size, num_heads, bias=False)  # decay α
        self.g_proj = nn.Linear(hidden_size, num_heads * value_dim, bias=False)  # read gate
        self.o_proj = nn.Linear(num_heads * value_dim, hidden_size, bias=False)
        self.A_log = nn.Parameter(torch.zeros(num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(num_heads))

    def _heads(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, dim)  # [B, T, H·D] → [B, T, H, D]

    def read(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``x [B, T, D]``, ``state [B, H, K, V]`` → the memory's contribution ``[B, T, D]``."""
        q = F.normalize(self._heads(self.q_proj(x).float(), self.key_dim), dim=-1)
        gate = torch.sigmoid(self._heads(self.g_proj(x).float(), self.value_dim))
        y = (gate * read_memory(q, state)).flatten(-2)
        return self.o_proj(y.to(x.dtype))

    def write_inputs(self, x: torch.Tensor) -> WriteInputs:
        """The per-token write quantities for ``x [B, T, D]``."""
        k = F.normalize(self._heads(self.k_proj(x).float(), self.key_dim), dim=-1)
        v = self._heads(self.v_proj(x).float(), self.value_dim)
        beta = torch.sigmoid(self.b_proj(x).float())
        # log α = −exp(A_log) · softplus(W_α x + dt_bias), so α ∈ (0, 1]
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
        return WriteInputs(k=k, v=v, g=g, beta=beta)

    def reset_parameters(self, std: float = 0.02) -> None:
        """Initialise for training from scratch: small projections, decay close to 1."""
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.b_proj, self.a_proj, self.g_proj, self.o_proj):
            nn.init.normal_(linear.weight, std=std)
        with torch.no_grad():
            self.A_log.fill_(-4.0)
            self.dt_bias.fill_(0.0)
