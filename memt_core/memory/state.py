"""Per-session memory tensors and their copy-on-write candidates."""

from __future__ import annotations

from typing import Iterator, Mapping

import torch


class MemoryState:
    """One session's memory: an FP32 ``[1, H, K, V]`` tensor per memory layer.

    A state with no tensors is *empty* and reads as zeros. Tensors are never changed in place: a
    write stores a new tensor, so ``fork()`` is a cheap copy of the mapping and a candidate made from
    published memory never disturbs it.
    """

    __slots__ = ("_layers",)

    def __init__(self, layers: Mapping[int, torch.Tensor] | None = None):
        self._layers: dict[int, torch.Tensor] = dict(layers or {})

    @property
    def is_empty(self) -> bool:
        return not self._layers

    def layers(self) -> Iterator[int]:
        return iter(sorted(self._layers))

    def get(self, layer: int) -> torch.Tensor | None:
        return self._layers.get(layer)

    def set(self, layer: int, tensor: torch.Tensor) -> None:
        """Store a new tensor for ``layer`` (the old one, possibly shared, is left untouched)."""
        if tensor.dtype != torch.float32 or tensor.dim() != 4 or tensor.shape[0] != 1:
            raise ValueError(f"memory tensors are FP32 [1, H, K, V]; got {tensor.dtype} {tuple(tensor.shape)}")
        self._layers[layer] = tensor

    def fork(self) -> "MemoryState":
        """A candidate that shares every tensor until it is written."""
        return MemoryState(self._layers)

    def tensors(self) -> dict[int, torch.Tensor]:
        return dict(self._layers)

    def to(self, device: torch.device | str) -> "MemoryState":
        return MemoryState({layer: t.to(device) for layer, t in self._layers.items()})

    def equal(self, other: "MemoryState") -> bool:
        """Bit-exact equality, an empty state equal only to an empty one."""
        if set(self._layers) != set(other._layers):
            return False
        return all(torch.equal(self._layers[i].cpu(), other._layers[i].cpu()) for i in self._layers)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._layers.values())

    def __repr__(self) -> str:
        return f"MemoryState(layers={sorted(self._layers)})"
