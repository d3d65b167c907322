"""The OpenAI-compatible proxy's session admin routes (``/v1/memt/sessions/{id}``) from Python.

For code that talks to a MemT proxy rather than to a memt_core server, such as the LangChain and
LlamaIndex integrations. Failures raise ``MemTClientError`` carrying the HTTP status and, as ``cause``,
the typed error of that status (e.g. ``SessionBusy`` for 409 ``session_busy``). Needs only httpx.
"""

from __future__ import annotations

from typing import Any

import httpx

from memt_core.client.native import json_or_text, check_response


class ProxySessions:
    """Inspect, snapshot, restore, reset and close sessions of a proxy at ``base_url`` (its OpenAI base URL, ``…/v1``)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 300, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.transport = transport

    def _call(self, action: str, method: str, session: str, suffix: str = "", body: dict | None = None) -> Any:
        with httpx.Client(headers=self.headers, timeout=self.timeout, transport=self.transport) as http:
            response = http.request(method, f"{self.base_url}/memt/sessions/{session}{suffix}", json=body)
        return check_response(response.status_code, json_or_text(response.text), f"session {action}")

    def inspect(self, session: str) -> dict:
        """The session's state on the proxy (committed messages, pending tool call) and on the MemT server."""
        return self._call("inspect", "GET", session)

    def save(self, session: str, name: str | None = None, *, overwrite: bool = False) -> str:
        """Save the session's memory as a snapshot on the server; returns the snapshot's name."""
        return self._call("save", "POST", session, "/snapshots", {"name": name, "overwrite": overwrite})["snapshot"]

    def restore(self, session: str, name: str) -> dict:
        """Replace the session's memory with a saved snapshot."""
        return self._call("restore", "POST", session, "/restore", {"name": name})

    def reset(self, session: str) -> dict:
        """Clear the session's memory."""
        return self._call("reset", "POST", session, "/reset")

    def close(self, session: str) -> dict:
        """Delete the session and its memory."""
        return self._call("close", "DELETE", session)


class SessionAdminMixin:
    """``inspect_session()`` … ``close_session()`` for an integration bound to one proxy session.

    The class using it has a ``session_id`` and implements ``_proxy_sessions()``.
    """

    session_id: str | None

    def _proxy_sessions(self) -> ProxySessions:
        raise NotImplementedError

    def _session(self) -> tuple[ProxySessions, str]:
        if self.session_id is None:
            raise ValueError("session admin needs a session_id")
        return self._proxy_sessions(), self.session_id

    def inspect_session(self) -> dict:
        """The session's state on the proxy and the MemT server."""
        sessions, session = self._session()
        return sessions.inspect(session)

    def save_snapshot(self, name: str | None = None, *, overwrite: bool = False) -> str:
        """Save the session's memory as a snapshot on the server; returns its name."""
        sessions, session = self._session()
        return sessions.save(session, name, overwrite=overwrite)

    def restore_snapshot(self, name: str) -> dict:
        """Replace the session's memory with a saved snapshot."""
        sessions, session = self._session()
        return sessions.restore(session, name)

    def reset_memory(self) -> dict:
        """Clear the session's memory."""
        sessions, session = self._session()
        return sessions.reset(session)

    def close_session(self) -> dict:
        """Delete the session and its memory."""
        sessions, session = self._session()
        return sessions.close(session)
