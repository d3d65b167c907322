"""Model execution behind one interface (``Engine``); implementations are chosen by name.

``ENGINES`` maps each ``--engine`` name to its implementation, imported only when chosen (an
implementation imports torch or a serving framework). ``engine_class(name)`` returns the class.
"""

from __future__ import annotations

import importlib

from memt_core.engine.base import CommitInfo, Engine, EngineOptions, EngineStats, TokenEvent

#: ``--engine`` name → "module:Class" of its implementation
ENGINES: dict[str, str] = {
    "torch": "memt_core.engine.torch_engine:TorchEngine",
}


def engine_class(name: str) -> type[Engine]:
    """The implementation registered as ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        target = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}") from None
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def __getattr__(name: str):
    # ``from memt_core.engine import TorchEngine`` for tests and benches, without importing torch eagerly
    if name == "TorchEngine":
        return engine_class("torch")
    raise AttributeError(name)


__all__ = ["ENGINES", "CommitInfo", "Engine", "EngineOptions", "EngineStats", "TokenEvent", "engine_class"]
