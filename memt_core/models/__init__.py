"""MemT model classes: a transformers backbone with memory modules beside chosen attention layers."""

from memt_core.models.memory import MemoryModule, WriteInputs
from memt_core.models.memt import MemTForCausalLM, MemTOutput
from memt_core.models.weights import build_backbone, load_model, save_weights

__all__ = ["MemTForCausalLM", "MemTOutput", "MemoryModule", "WriteInputs", "build_backbone", "load_model", "save_weights"]
