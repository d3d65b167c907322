"""The memory store's effect table: every effect of the protocol has exactly one place that carries it out."""

from __future__ import annotations

import inspect

import pytest

from memt_core.engine.store import ENGINE_EFFECTS, MemoryStore
from memt_core.protocol import effects as fx

EFFECTS = {cls for _, cls in inspect.getmembers(fx, inspect.isclass) if issubclass(cls, fx.Effect) and cls is not fx.Effect}


def test_every_effect_has_a_handler():
    assert len(EFFECTS) == 14
    assert set(MemoryStore.HANDLERS) == EFFECTS - {fx.CancelRequest}
    assert ENGINE_EFFECTS == {fx.CancelRequest}  # the engine stops queries itself (TorchEngine.apply)
    for effect, handler in MemoryStore.HANDLERS.items():
        assert inspect.signature(handler).parameters["e"].annotation == f"fx.{effect.__name__}", handler


def test_an_effect_without_a_handler_is_refused():
    store = MemoryStore(identity="i", layers=(0,), shape=(1,), device="cpu", state_directory=None)
    with pytest.raises(TypeError, match="does not carry out CancelRequest effects"):
        store.apply(fx.CancelRequest("s1", rid="r"))
    assert store.apply(fx.NewMemory("s1")) == 0 and store.get("s1").version == 0
