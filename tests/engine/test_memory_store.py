"""The memory store: every effect of the protocol has exactly one place that carries it out, and the store holds
handles, never tensors: every handle a session lets go of is released, none that something still reads."""

from __future__ import annotations

import inspect

import pytest
import torch

from memt_core.engine.step import Handles
from memt_core.engine.store import ENGINE_EFFECTS, MemoryStore
from memt_core.memory.state import MemoryState
from memt_core.protocol import effects as fx

EFFECTS = {cls for _, cls in inspect.getmembers(fx, inspect.isclass) if issubclass(cls, fx.Effect) and cls is not fx.Effect}


class Table:
    """The runner's side of the seam (``MemoryTable``) as a dict, the way ``ModelRunner`` keeps it."""

    def __init__(self):
        self.states: dict[int, MemoryState] = {}

    def put_memory(self, handle, state):
        self.states[handle] = state

    def fork_memory(self, source, handle):
        self.states[handle] = self.states[source].fork()

    def memory(self, handle):
        return MemoryState() if handle is None else self.states[handle]


def new_store():
    table, released = Table(), []

    def release(handle):
        released.append(handle)
        table.states.pop(handle, None)

    store = MemoryStore(identity="i", layers=(0,), shape=(1, 1, 2, 2), table=table, handles=Handles(), release=release,
                        state_directory=None)
    return store, table, released


def test_every_effect_has_a_handler():
    assert len(EFFECTS) == 14
    assert set(MemoryStore.HANDLERS) == EFFECTS - {fx.CancelRequest}
    assert ENGINE_EFFECTS == {fx.CancelRequest}  # the engine stops queries itself (TorchEngine.apply)
    for effect, handler in MemoryStore.HANDLERS.items():
        assert inspect.signature(handler).parameters["e"].annotation == f"fx.{effect.__name__}", handler


def test_an_effect_without_a_handler_is_refused():
    store, _, _ = new_store()
    with pytest.raises(TypeError, match="does not carry out CancelRequest effects"):
        store.apply(fx.CancelRequest("s1", rid="r"))
    assert store.apply(fx.NewMemory("s1")) == 0 and store.get("s1").version == 0


def test_handles_are_released_when_let_go_and_a_pinned_fork_outlives_its_source():
    store, table, released = new_store()
    store.apply(fx.NewMemory("s"))
    store.apply(fx.ForkCandidate("s", transaction="t"))
    first = store.candidate("s", "t").memory
    written = MemoryState({0: torch.ones(1, 1, 2, 2)})
    table.states[first] = written  # what a commit does in the runner
    store.apply(fx.PublishCandidate("s", transaction="t"))
    assert store.get("s").published == first and released == []
    pinned = store.pin("s")
    assert pinned != first and table.memory(pinned).equal(written)
    store.apply(fx.ForkCandidate("s", transaction="u"))
    store.apply(fx.DropCandidate("s", transaction="u"))
    store.apply(fx.ClearMemory("s"))
    assert first in released and store.get("s").published is None
    assert table.memory(pinned).equal(written), "a query's pinned memory is its own"
    store.apply(fx.ForkCandidate("s", transaction="v"))
    store.apply(fx.DropSession("s"))
    assert set(table.states) == {pinned}, "everything the session held is released"
