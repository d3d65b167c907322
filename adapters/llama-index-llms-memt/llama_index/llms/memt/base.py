"""``MemT``: LlamaIndex's OpenAI-like LLM pointed at a MemT proxy session.

Chat, stream_chat, their async variants and function calling come from ``OpenAILike``; ``session_id``
and ``memory`` are sent as the proxy's ``X-MemT-Session`` / ``X-MemT-Memory`` headers. Session admin
helpers call the proxy's ``/v1/memt/sessions/{id}`` routes.
"""

from __future__ import annotations

from typing import Any, Literal

from llama_index.core.bridge.pydantic import Field
from llama_index.llms.openai_like import OpenAILike

from memt_core.client.proxy_sessions import ProxySessions, SessionAdminMixin

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class MemT(SessionAdminMixin, OpenAILike):
    """A MemT proxy session as a LlamaIndex LLM.

    Example:
        .. code-block:: python

            from llama_index.core.llms import ChatMessage
            from llama_index.llms.memt import MemT

            llm = MemT(model="memt-tiny-demo", session_id="alice")
            llm.chat([ChatMessage(role="user", content="Hi, my name is Alice.")])
    """

    session_id: str | None = Field(default=None, description="MemT session (X-MemT-Session); None: stateless chat")
    memory: Literal["auto", "read", "off"] | None = Field(default=None, description="memory policy (X-MemT-Memory)")

    def __init__(self, *, api_base: str = DEFAULT_BASE_URL, api_key: str = "memt", session_id: str | None = None,
                 memory: str | None = None, default_headers: dict | None = None, **kwargs: Any):
        headers = dict(default_headers or {})
        if session_id is not None:
            headers["X-MemT-Session"] = session_id
        if memory is not None:
            headers["X-MemT-Memory"] = memory
        kwargs.setdefault("is_chat_model", True)
        kwargs.setdefault("is_function_calling_model", True)
        kwargs.setdefault("context_window", 8192)
        super().__init__(api_base=api_base, api_key=api_key, default_headers=headers, session_id=session_id, memory=memory, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "MemT"

    def _proxy_sessions(self) -> ProxySessions:
        return ProxySessions(self.api_base, api_key=self.api_key, timeout=self.timeout)
