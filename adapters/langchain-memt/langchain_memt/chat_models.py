"""``ChatMemT``: LangChain's OpenAI chat model pointed at a MemT proxy session.

It is ``langchain_openai.ChatOpenAI`` (so invoke, stream, ainvoke, astream, bind_tools and tool-calling
agents behave as usual) with two more fields, sent as the proxy's headers on every request:
``session_id`` → ``X-MemT-Session`` and ``memory`` → ``X-MemT-Memory``. Session admin helpers call
the proxy's ``/v1/memt/sessions/{id}`` routes.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from langchain_openai import ChatOpenAI
from pydantic import Field, model_validator

from memt_core.client.proxy_sessions import ProxySessions, SessionAdminMixin

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class ChatMemT(SessionAdminMixin, ChatOpenAI):
    """A MemT proxy session as a LangChain chat model.

    Example:
        .. code-block:: python

            from langchain_memt import ChatMemT

            llm = ChatMemT(model="memt-tiny-demo", session_id="alice", memory="auto")
            llm.invoke("Hi, my name is Alice.")
    """

    session_id: str | None = Field(default=None, description="MemT session (X-MemT-Session); None: stateless chat")
    memory: Literal["auto", "read", "off"] | None = Field(default=None, description="memory policy (X-MemT-Memory); None: the proxy's default")

    @model_validator(mode="before")
    @classmethod
    def _memt_headers(cls, values: Any) -> Any:
        if isinstance(values, dict):
            values = dict(values)
            if not (values.get("base_url") or values.get("openai_api_base")):
                values["base_url"] = DEFAULT_BASE_URL
            if not (values.get("api_key") or values.get("openai_api_key") or os.environ.get("OPENAI_API_KEY")):
                values["api_key"] = "memt"  # the proxy may run without keys; the SDK still wants one
            headers = dict(values.get("default_headers") or {})
            if values.get("session_id") is not None:
                headers["X-MemT-Session"] = values["session_id"]
            if values.get("memory") is not None:
                headers["X-MemT-Memory"] = values["memory"]
            values = {**values, "default_headers": headers}
        return values

    @property
    def _llm_type(self) -> str:
        return "memt-chat"

    def _proxy_sessions(self) -> ProxySessions:
        key = self.openai_api_key.get_secret_value() if hasattr(self.openai_api_key, "get_secret_value") else self.openai_api_key
        return ProxySessions(self.openai_api_base or DEFAULT_BASE_URL, api_key=key, timeout=self.request_timeout or 300)
