"""LlamaIndex integration for MemT: the ``MemT`` LLM, a chat model whose conversation lives in latent memory."""

from llama_index.llms.memt.base import MemT

__all__ = ["MemT"]
