"""``MemT``: LlamaIndex's OpenAI-like LLM pointed at a MemT proxy session.

Chat, stream_chat, their async variants and function calling come from ``OpenAILike``; ``session_id``
and ``memory`` are sent as the proxy's ``X-MemT-Session`` / ``X-MemT-Memory`` headers. Session admin
helpers call the proxy's ``/v1/memt/sessions/{id}`` routes.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
from llama_index.core.bridge.pydantic import Field
from llama_index.llms.openai_like import OpenAILike

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class MemT(OpenAILike):
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

    def _admin(self, method: str, suffix: str = "", json: dict | None = None) -> dict:
        if self.session_id is None:
            raise ValueError("session admin needs a session_id")
        url = f"{self.api_base.rstrip('/')}/memt/sessions/{self.session_id}{suffix}"
        response = httpx.request(method, url, json=json, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=self.timeout)
        if response.status_code >= 400:
            raise RuntimeError(f"MemT proxy answered {response.status_code}: {response.text}")
        return response.json()

    def inspect_session(self) -> dict:
        return self._admin("GET")

    def save_snapshot(self, name: str | None = None, *, overwrite: bool = False) -> str:
        return self._admin("POST", "/snapshots", {"name": name, "overwrite": overwrite})["snapshot"]

    def restore_snapshot(self, name: str) -> dict:
        return self._admin("POST", "/restore", {"name": name})

    def reset_memory(self) -> dict:
        return self._admin("POST", "/reset")

    def close_session(self) -> dict:
        return self._admin("DELETE")
