"""``NativeClient``: memt-http-v1 over HTTP, one method per request kind.

It carries the server epoch automatically (learned from ``/memt/capabilities``), sends a fresh
nonce with every generation request, adds ``Authorization: Bearer`` when given an API key, and maps
every transport failure to ``MemTClientError`` once, here. A failure after the request may have
reached the server is *uncertain* for state-changing requests: the caller must reconcile with
``status``/``recover`` rather than retry.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any, Iterator

import httpx

from memt_core.client.errors import MemTClientError
from memt_core.errors import error_from_wire

#: Control actions that change nothing on the server (safe to retry; never uncertain).
READ_ONLY_ACTIONS = {"inspect", "status"}


def new_nonce() -> str:
    return uuid.uuid4().hex


class NativeClient:
    """Low-level client of one memt_core server. ``timeout`` is in seconds."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 300, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)
        self._capabilities: dict | None = None

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "NativeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _mapped(self, stage: str, *, changes_state: bool):
        """Map httpx failures to MemTClientError, deciding whether the outcome is uncertain."""
        try:
            yield
        except httpx.ConnectError as exc:
            raise MemTClientError(f"{stage}: cannot connect to {self.base_url}: {exc}", stage=stage, uncertain=False) from exc
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise MemTClientError(
                f"{stage}: the connection failed after the request was sent ({type(exc).__name__}); "
                + ("the outcome is uncertain: call status()/recover() before further writes" if changes_state else "retry"),
                stage=stage,
                uncertain=changes_state,
            ) from exc

    def _check(self, response: httpx.Response, stage: str) -> Any:
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = response.text
            error = error_from_wire(response.status_code, body)
            raise MemTClientError(f"{stage}: {error.message}", stage=stage, status=response.status_code, cause=error)
        return response.json()

    # ------------------------------------------------------------------ discovery

    def capabilities(self, *, refresh: bool = False) -> dict:
        """``GET /memt/capabilities`` (cached); also records the server epoch."""
        if self._capabilities is None or refresh:
            with self._mapped("capabilities", changes_state=False):
                response = self._http.get("/memt/capabilities")
            self._capabilities = self._check(response, "capabilities")
        return self._capabilities

    def identity(self) -> dict:
        with self._mapped("identity", changes_state=False):
            response = self._http.get("/memt/identity")
        return self._check(response, "identity")

    @property
    def epoch(self) -> str:
        return self.capabilities()["epoch"]

    # ------------------------------------------------------------------ requests

    def control(self, action: str, session: str | None = None, **fields: Any) -> dict:
        """``POST /memt/control``; ``None`` fields are left out, the epoch is added."""
        body = {"action": action, "epoch": self.epoch}
        if session is not None:
            body["session"] = session
        body.update({k: v for k, v in fields.items() if v is not None})
        with self._mapped(action, changes_state=action not in READ_ONLY_ACTIONS):
            response = self._http.post("/memt/control", json=body)
        return self._check(response, action)

    def query(
        self,
        session: str,
        lease: str,
        input_ids: list[int],
        *,
        sampling_params: dict | None = None,
        stream: bool = False,
        nonce: str | None = None,
    ) -> dict | Iterator[dict]:
        """Generate from ``input_ids`` reading the session's memory; ``stream`` yields cumulative bodies."""
        params = {"max_new_tokens": 512, **(sampling_params or {})}
        body = {
            "rid": f"memt|{session}|query|{nonce or new_nonce()}",
            "input_ids": list(input_ids),
            "sampling_params": params,
            "memt_lease": lease,
            "memt_epoch": self.epoch,
            "stream": stream,
        }
        if stream:
            return self._stream(body)
        with self._mapped("query", changes_state=False):
            response = self._http.post("/generate", json=body)
        return self._check(response, "query")

    def _stream(self, body: dict) -> Iterator[dict]:
        with self._mapped("query", changes_state=False):
            with self._http.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    self._check(response, "query")
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = error_from_wire(400, chunk)
                        raise MemTClientError(f"query: {error.message}", stage="query", cause=error)
                    yield chunk

    def commit(self, session: str, lease: str, transaction: str, input_ids: list[int], *, nonce: str | None = None) -> dict:
        """Write ``input_ids`` into the open transaction (one commit request)."""
        body = {
            "rid": f"memt|{session}|commit:{len(input_ids)}|{nonce or new_nonce()}",
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": 0},
            "memt_lease": lease,
            "memt_transaction": transaction,
            "memt_epoch": self.epoch,
        }
        with self._mapped("commit", changes_state=True):
            response = self._http.post("/generate", json=body)
        result = self._check(response, "commit")
        return result

    def commit_turns(self, session: str, lease: str, transaction: str, turns: list[list[int]]) -> list[dict]:
        """One commit per turn, in order, in one transaction."""
        return [self.commit(session, lease, transaction, ids) for ids in turns]
