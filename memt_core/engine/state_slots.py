"""State slots: the sessions' latent memory, and the decode batch's linear-attention states, in tensors allocated once.

With a KV budget the engine's memory is sized up front (``memt_core.engine.budget``), the memory states included:
per memory layer one FP32 tensor ``[slots, H, K, V]`` (on a rank, its heads). A state the runner holds is a
``MemoryState`` whose tensors are one slot's rows. States are never changed in place, so a fork shares its source's
slot (counted) and a commit's new state takes a slot of its own; a slot is free again when no handle names it.

How many: every session keeps a published state and may build one candidate, and a step's commits each need a slot
before the old candidate's is given back, so ``slots_for(sessions, commits)`` is twice the sessions plus the commit
batch plus a margin for handles let go but not yet freed (they are freed at the next step). When no slot is free, a
commit batch is refused with ``SlotsFull`` (503) before anything is written, and the engine goes on. A put (a
memory imported, loaded or moved to another rank) never fails for want of a slot: it is allocated beside the slots
and counted (``overflow``, logged), because on several ranks a put is replayed where no error could reach the
client.

Handles are taken and let go from the event loop's thread (puts, forks) and the engine's (commits, frees): one lock.

``RecurrentSlots``: the running requests' linear-attention states (each layer's convolution window and gated delta
rule matrix, a fixed size per request) in one tensor per layer and kind of ``--max-running-requests`` rows, the
decode batch's rows its first ones. Joining a batch copies the new rows in after the others (``memt_core.engine.kv``)
where transformers concatenates into new tensors; a row leaving moves the rows after it up. The fused decode step
advances the states in place, in the slots. A prefilled request's states and a retained context's stay its own until
it joins the batch.

``RetainedSlots``: a retained context's linear-attention states (a streaming session's, kept after its query for
the next one: ``retain_kv``) in slots made at the first one kept, a row per session. Kept, the context's states
become its slot's rows; taken back for the session's next query, they are copied out and the slot is free again.
With none free, the context keeps its own tensors (counted in ``overflow``).
"""

from __future__ import annotations

import logging
import threading

import torch

from memt_core.errors import MemTError
from memt_core.memory.state import MemoryState

log = logging.getLogger("memt.engine")

#: slots beyond twice the sessions and a commit batch: handles let go whose slots come back at the next step
MARGIN = 8


class SlotsFull(MemTError):
    """Every memory state slot is in use (503): the new state is refused, nothing changes."""

    status = 503


def slots_for(sessions: int, commits: int) -> int:
    """Slots for ``sessions`` sessions (a published state and a candidate each) and a batch of ``commits``."""
    return 2 * sessions + commits + MARGIN


def sessions_of(slots: int) -> int:
    """The sessions ``slots_for`` made room for, and half the commit batch: a retained context's slot each."""
    return max(1, (slots - MARGIN) // 2)


class StateSlots:
    def __init__(self, layers: tuple[int, ...], shape: tuple[int, int, int], slots: int, *, device):
        self.slabs = {layer: torch.zeros(slots, *shape, dtype=torch.float32, device=device) for layer in layers}
        self.slots = slots
        self._free = list(range(slots - 1, -1, -1))
        self._refs = [0] * slots
        self._slot_of: dict[int, int] = {}  # handle → its slot
        self._lock = threading.Lock()
        self.overflow = 0  # states put beside the slots, none being free

    @property
    def used(self) -> int:
        with self._lock:
            return self.slots - len(self._free)

    def bytes(self) -> int:
        return sum(slab.numel() * slab.element_size() for slab in self.slabs.values())

    def _take(self, count: int) -> list[int]:
        with self._lock:
            if len(self._free) < count:
                raise SlotsFull(f"all {self.slots} memory state slots are in use ({len(self._free)} free, {count} needed): "
                                "close or reset sessions, or serve with more --max-sessions-per-rank")
            taken = [self._free.pop() for _ in range(count)]
            for slot in taken:
                self._refs[slot] = 1
            return taken

    def _unref(self, slot: int) -> None:
        self._refs[slot] -= 1
        if self._refs[slot] == 0:
            self._free.append(slot)

    def _fill(self, slot: int, state: MemoryState) -> MemoryState:
        held = MemoryState({layer: self.slabs[layer][slot : slot + 1] for layer in state.layers()})
        for layer in state.layers():
            held.get(layer).copy_(state.get(layer))
        return held

    def put(self, handle: int, state: MemoryState) -> MemoryState:
        """``state`` copied into a free slot named by ``handle`` (an empty state takes none); with none free, ``state``
        itself, beside the slots (counted in ``overflow``)."""
        if state.is_empty:
            return state
        try:
            [slot] = self._take(1)
        except SlotsFull as exc:
            self.overflow += 1
            log.warning("%s; a memory state is held beside them (%d so far)", exc.message, self.overflow)
            return state
        with self._lock:
            self._slot_of[handle] = slot
        return self._fill(slot, state)

    def share(self, source: int, handle: int) -> None:
        """``handle`` names ``source``'s slot as well (a fork)."""
        with self._lock:
            slot = self._slot_of.get(source)
            if slot is not None:
                self._refs[slot] += 1
                self._slot_of[handle] = slot

    def replace(self, states: dict[int, MemoryState]) -> dict[int, MemoryState]:
        """Each handle's new state in a slot of its own, the old ones let go; every slot is taken before anything
        changes, so a refusal (``SlotsFull``) leaves every handle as it was."""
        filled = [(handle, state) for handle, state in states.items() if not state.is_empty]
        taken = self._take(len(filled))
        held = {handle: state for handle, state in states.items() if state.is_empty}
        for slot, (handle, state) in zip(taken, filled):
            held[handle] = self._fill(slot, state)
        with self._lock:
            for handle in states:
                old = self._slot_of.pop(handle, None)
                if old is not None:
                    self._unref(old)
            for slot, (handle, _) in zip(taken, filled):
                self._slot_of[handle] = slot
        return held

    def drop(self, handle: int) -> None:
        """``handle`` names its slot no more (free once nothing else does)."""
        with self._lock:
            slot = self._slot_of.pop(handle, None)
            if slot is not None:
                self._unref(slot)

    def describe(self) -> dict:
        return {"slots": self.slots, "slots_used": self.used, "bytes": self.bytes(), "overflow": self.overflow}


class RecurrentSlots:
    """One tensor of ``rows`` rows per linear-attention layer and state kind, made at the first batch that needs it
    (its shape is the states', a rank's heads on TP) and never grown."""

    def __init__(self, rows: int):
        self.rows = rows
        self.slabs: dict[tuple[int, str], torch.Tensor] = {}

    def place(self, key: tuple[int, str], parts: list[tuple[torch.Tensor, int]]) -> torch.Tensor | None:
        """The batch's states for ``key`` as the slab's first rows: ``parts`` (a tensor and the row it starts at),
        copied in unless already there; None when they would not fit (the caller concatenates instead)."""
        total = sum(part.shape[0] for part, _ in parts)
        first = parts[0][0]
        if total > self.rows:
            return None
        slab = self.slabs.get(key)
        if slab is None:
            slab = self.slabs[key] = torch.zeros(self.rows, *first.shape[1:], dtype=first.dtype, device=first.device)
        if slab.shape[1:] != first.shape[1:] or slab.dtype != first.dtype:
            return None
        for part, start in parts:
            if not (part.data_ptr() == slab[start:].data_ptr() and part.is_contiguous()):
                slab[start : start + part.shape[0]].copy_(part)
        return slab[:total]

    def held(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a slab's first rows."""
        return any(tensor.data_ptr() == slab.data_ptr() for slab in self.slabs.values())

    def bytes(self) -> int:
        return sum(slab.numel() * slab.element_size() for slab in self.slabs.values())

    def describe(self) -> dict:
        return {"rows": self.rows, "bytes": self.bytes()}


class RetainedSlots:
    """Retained contexts' linear-attention states, a row each in one tensor per layer and kind (see the module)."""

    def __init__(self, rows: int):
        self.rows = rows
        self.slabs: dict[tuple[int, str, int], torch.Tensor] = {}
        self._free = list(range(rows - 1, -1, -1))
        self._slot_of: dict[int, int] = {}  # retained handle → its row
        self.overflow = 0

    @staticmethod
    def _states(cache):
        """(key, dict, index) of every linear-attention state in ``cache``."""
        for number, layer in enumerate(cache.layers):
            for kind in ("conv_states", "recurrent_states"):
                states = getattr(layer, kind, None)
                if isinstance(states, dict):
                    yield from (((number, kind, i), states, i) for i, t in states.items() if isinstance(t, torch.Tensor))

    def keep(self, handle: int, cache) -> None:
        """``cache``'s states into a free row named by ``handle`` (the cache then reads them there)."""
        states = list(self._states(cache))
        if not states:
            return
        fits = all(key not in self.slabs or (self.slabs[key].shape[1:] == d[i].shape[1:] and self.slabs[key].dtype == d[i].dtype)
                   for key, d, i in states)
        if not self._free or not fits:
            self.overflow += 1
            return
        row = self._slot_of[handle] = self._free.pop()
        for key, d, i in states:
            slab = self.slabs.get(key)
            if slab is None:
                slab = self.slabs[key] = torch.zeros(self.rows, *d[i].shape[1:], dtype=d[i].dtype, device=d[i].device)
            slab[row : row + 1].copy_(d[i])
            d[i] = slab[row : row + 1]

    def take(self, handle: int, cache) -> None:
        """``handle``'s states copied out of its row into ``cache`` (a query reads and advances them), the row free."""
        row = self._slot_of.pop(handle, None)
        if row is None:
            return
        for _, d, i in self._states(cache):
            d[i] = d[i].clone()
        self._free.append(row)

    def drop(self, handle: int) -> None:
        """The context is let go: its row is free."""
        row = self._slot_of.pop(handle, None)
        if row is not None:
            self._free.append(row)

    def describe(self) -> dict:
        return {"rows": self.rows, "rows_used": len(self._slot_of), "overflow": self.overflow,
                "bytes": sum(slab.numel() * slab.element_size() for slab in self.slabs.values())}
