"""Model execution: the torch engine (CPU or one GPU) and its session memory store."""

from memt_core.engine.store import SessionStore
from memt_core.engine.torch_engine import CommitInfo, EngineStats, TokenEvent, TorchEngine

__all__ = ["CommitInfo", "EngineStats", "SessionStore", "TokenEvent", "TorchEngine"]
