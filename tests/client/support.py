"""Helpers of the client tests: ``RecordingTransport`` (logs every HTTP request the real
``NativeClient`` sends) and ``Live`` (one family's scripted checkpoint, server and client pieces).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
from e2e.servers import MemTServer

from memt_core.families import NANO
from memt_core.client import MemTSession, NativeClient, load_chat_format, load_tokenizer

API_KEY = "client-test-key"  # the Bearer key of the keyed test server

#: An encoder side effect: every process that executes the Flash checkpoint's encoding_dsv4.py
#: appends its PID to the file named by this variable (see test_client_formats).
ENCODER_MARKER_ENV = "MEMT_TEST_ENCODER_MARKER"
ENCODER_MARKER_CODE = f'''

# test marker: which processes execute this file
import os as _os
if _os.environ.get("{ENCODER_MARKER_ENV}"):
    with open(_os.environ["{ENCODER_MARKER_ENV}"], "a") as _marker:
        _marker.write(f"{{_os.getpid()}}\\n")
'''


# ---------------------------------------------------------------------- recording


@dataclass
class Record:
    method: str
    path: str
    operation: str  # "GET /memt/capabilities", a control action, "query", "commit"
    body: dict | None
    authorization: str | None = None
    status: int | None = None


class RecordingTransport(httpx.BaseTransport):
    """Forwards to ``inner`` and records (method, path, control action or RID operation) per request.

    ``before(record)`` / ``after(record, response)`` hooks let a test act around one request; ``after``
    may raise to lose a response that the server did send.
    """

    def __init__(self, inner: httpx.BaseTransport | None = None):
        self.inner = inner or httpx.HTTPTransport()
        self.records: list[Record] = []
        self.before: Callable[[Record], None] | None = None
        self.after: Callable[[Record, httpx.Response], None] | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = None
        if request.method == "POST":
            body = json.loads(request.content or b"null")
        path = request.url.path
        if path == "/memt/control":
            operation = body["action"]
        elif path == "/generate":
            operation = body["rid"].split("|")[2].split(":")[0] if str(body.get("rid", "")).startswith("memt|") else "generate"
        else:
            operation = f"{request.method} {path}"
        record = Record(request.method, path, operation, body, request.headers.get("authorization"))
        self.records.append(record)
        if self.before is not None:
            self.before(record)
        response = self.inner.handle_request(request)
        record.status = response.status_code
        if self.after is not None:
            self.after(record, response)
        return response

    def close(self) -> None:
        self.inner.close()

    # helpers for assertions
    def mark(self) -> int:
        return len(self.records)

    def since(self, mark: int) -> list[str]:
        return [r.operation for r in self.records[mark:]]

    def records_since(self, mark: int, operation: str | None = None) -> list[Record]:
        return [r for r in self.records[mark:] if operation is None or r.operation == operation]


# ---------------------------------------------------------------------- scripted checkpoints and servers


@dataclass
class Live:
    """One family's scripted checkpoint, its live server, and the client-side pieces for it."""

    family: str
    checkpoint: Path
    server: MemTServer
    tokenizer: object = None
    chat_format: object = None
    parser: object = None
    clients: list = field(default_factory=list)

    def __post_init__(self):
        self.tokenizer = load_tokenizer(self.checkpoint)
        self.chat_format, self.parser = load_chat_format(
            self.checkpoint, tokenizer=self.tokenizer, chat_template_kwargs={"enable_thinking": False}
        )

    @property
    def eos(self) -> int:
        return self.tokenizer.convert_tokens_to_ids("<|im_end|>") if self.family == NANO else self.tokenizer.eos_token_id

    def client(self, transport: httpx.BaseTransport | None = None, **kwargs) -> tuple[NativeClient, RecordingTransport]:
        recorder = transport if isinstance(transport, RecordingTransport) else RecordingTransport(transport)
        client = NativeClient(self.server.url, api_key=self.server.api_key, transport=recorder, **kwargs)
        self.clients.append(client)
        return client, recorder

    def session(self, client: NativeClient, **kwargs) -> MemTSession:
        return MemTSession(client, self.chat_format, self.parser, **kwargs)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def close(self) -> None:
        for client in self.clients:
            client.close()
