"""LangChain integration for MemT: ``ChatMemT``, a chat model whose conversation lives in latent memory."""

from langchain_memt.chat_models import ChatMemT

__all__ = ["ChatMemT"]
