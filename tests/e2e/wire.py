"""Raw memt-http-v1 calls for end-to-end tests: JSON bodies over httpx, statuses checked.

The tests deliberately speak the wire protocol directly (not through ``NativeClient``) so they pin
what the server accepts and answers. ``Wire`` wraps one ``httpx.Client`` and the server epoch.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

import httpx

WIRE_TYPE = "invalid_memory_request"


def nonce() -> str:
    return uuid.uuid4().hex[:16]


def unique(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def assert_error(response: httpx.Response, status: int, *, wire_type: str = WIRE_TYPE, match: str | None = None) -> str:
    """The response is ``status`` with ``{"error": {"type", "message"}}``; returns the message."""
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["type"] == wire_type, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message, body
    if match is not None:
        assert re.search(match, message, re.IGNORECASE), f"{match!r} not in {message!r}"
    return message


@dataclass
class Handle:
    """A session this test created and leased."""

    session: str
    lease: str


class Wire:
    def __init__(self, http: httpx.Client):
        capabilities = http.get("/memt/capabilities")
        assert capabilities.status_code == 200, capabilities.text
        self.http = http
        self.capabilities = capabilities.json()
        self.epoch = self.capabilities["epoch"]
        self.encoding = self.capabilities["native_encoding"]
        self.opened: list[Handle] = []  # sessions made by open(), for close_all()

    # ------------------------------------------------------------------ control

    def post_control(self, body) -> httpx.Response:
        return self.http.post("/memt/control", json=body)

    def control(self, action: str, session: str | None = None, *, expect: int = 200, **fields) -> dict:
        body = {"action": action, "epoch": self.epoch, **fields}
        if session is not None:
            body["session"] = session
        response = self.post_control(body)
        if expect == 200:
            assert response.status_code == 200, f"{action}: {response.status_code} {response.text}"
        else:
            assert_error(response, expect)
        return response.json()

    def ctl(self, action: str, handle: Handle, *, expect: int = 200, **fields) -> dict:
        """A control action on a leased session."""
        return self.control(action, handle.session, lease=handle.lease, expect=expect, **fields)

    def open(self, session: str | None = None, *, ttl: int = 600, **create_fields) -> Handle:
        """create + acquire."""
        name = self.control("create", session or unique(), **create_fields)["session"]
        lease = self.control("acquire", name, ttl=ttl)["lease"]
        handle = Handle(name, lease)
        self.opened.append(handle)
        return handle

    def close_all(self) -> None:
        """Best effort: close every session made by ``open()`` that still exists (cancel, release, close)."""
        for handle in self.opened:
            for rid in self.post_control({"action": "inspect", "session": handle.session}).json().get("in_flight", []):
                self.post_control({"action": "cancel", "session": handle.session, "lease": handle.lease, "request_id": rid})
            self.post_control({"action": "close", "session": handle.session, "lease": handle.lease})
        self.opened.clear()

    def write(self, handle: Handle, *token_lists: list[int], transaction: str | None = None, memory_read: bool | None = None) -> str:
        """begin → one commit per token list → publish."""
        transaction = transaction or unique("t")
        self.ctl("begin", handle, transaction=transaction)
        for ids in token_lists:
            self.commit(handle, transaction, ids)
        extra = {} if memory_read is None else {"memory_read": memory_read}
        self.ctl("publish", handle, transaction=transaction, **extra)
        return transaction

    def export(self, handle: Handle, file: str | None = None, **fields) -> dict:
        body = {"encoding": self.encoding, **fields}
        if file is not None:
            body["file"] = file
        return self.ctl("export", handle, **body)

    # ------------------------------------------------------------------ generation

    def post_generate(self, body) -> httpx.Response:
        return self.http.post("/generate", json=body)

    def commit_body(self, handle: Handle, transaction: str, ids: list[int], nonce_: str | None = None) -> dict:
        return {
            "rid": f"memt|{handle.session}|commit:{len(ids)}|{nonce_ or nonce()}",
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": 0},
            "memt_lease": handle.lease,
            "memt_transaction": transaction,
            "memt_epoch": self.epoch,
        }

    def query_body(
        self, handle: Handle, ids: list[int], max_new_tokens: int = 8, *, nonce_: str | None = None, stream: bool = False,
        session_params: dict | None = None, **sampling,
    ) -> dict:
        extra = {} if session_params is None else {"session_params": session_params}
        return {
            **extra,
            "rid": f"memt|{handle.session}|query|{nonce_ or nonce()}",
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, **sampling},
            "memt_lease": handle.lease,
            "memt_epoch": self.epoch,
            "stream": stream,
        }

    def commit(self, handle: Handle, transaction: str, ids: list[int], *, expect: int = 200, nonce_: str | None = None) -> dict:
        response = self.post_generate(self.commit_body(handle, transaction, ids, nonce_))
        if expect == 200:
            assert response.status_code == 200, response.text
        else:
            assert_error(response, expect)
        return response.json()

    def query(self, handle: Handle, ids: list[int], max_new_tokens: int = 8, *, expect: int = 200, session_params: dict | None = None, **sampling) -> dict:
        response = self.post_generate(self.query_body(handle, ids, max_new_tokens, session_params=session_params, **sampling))
        if expect == 200:
            assert response.status_code == 200, response.text
        else:
            assert_error(response, expect)
        return response.json()

    def plain(self, ids: list[int] | None = None, max_new_tokens: int = 8, *, text: str | None = None, **sampling) -> dict:
        body = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, **sampling}}
        if text is not None:
            body["text"] = text
        else:
            body["input_ids"] = list(ids)
        response = self.post_generate(body)
        assert response.status_code == 200, response.text
        return response.json()


def sse_frames(http: httpx.Client, body: dict) -> tuple[int, list[str]]:
    """POST a streaming request; returns the status and the ``data:`` payloads in order (raw strings)."""
    frames = []
    with http.stream("POST", "/generate", json=body) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code, [response.text]
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:"):
                frames.append(line[len("data:"):].strip())
            else:
                assert line == "" or line.startswith(":"), f"unexpected SSE line {line!r}"
    return 200, frames


def parse_frames(frames: list[str]) -> list[dict]:
    """All frames but the final ``[DONE]`` as JSON (asserting it is there, last and only once)."""
    assert frames and frames[-1] == "[DONE]", frames[-3:]
    assert frames.count("[DONE]") == 1
    return [json.loads(frame) for frame in frames[:-1]]


def metric(text: str, name: str, **labels) -> float:
    """The value of one Prometheus sample (0 when absent); ``labels`` must match exactly."""
    wanted = sorted(f'{key}="{value}"' for key, value in labels.items())
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sample, _, value = line.rpartition(" ")
        sample_name, _, sample_labels = sample.partition("{")
        found = sorted(filter(None, sample_labels.rstrip("}").split(",")))
        if sample_name == name and found == wanted:
            return float(value)
    return 0.0
