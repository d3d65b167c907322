"""What every route of the proxy reads from a request, read one way: its tenant, its session header, its
per-request controls, its body; and from them, once for either surface, the request's ``RequestContext``.

Each per-request control (memory policy, on-divergence, idempotency key) is a header or, the same value, a
key of the body's ``metadata`` (``CONTROLS``): a router such as SMG forwards the body's ``metadata`` but drops
unknown headers, so ``metadata`` is the one way that reaches the proxy in every deployment. The two may be
sent together only with the same value (else 400 naming the header).

Every JSON body is read through ``memt_core.request_body``: at most ``max_request_bytes`` (413 past it,
refused from ``Content-Length`` before anything is read), parsed with bounded integers, nesting and valid
Unicode (400 naming where), a large one parsed off the event loop, and then validated by a pydantic model
(400 naming the field). With API keys, every route but the two health checks needs one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from memt_core.bearer import bearer_token, matching
from memt_core.client.errors import MemTClientError
from memt_core.errors import InvalidRequest, PayloadTooLarge, RequestTimeout
from memt_core.protocol.events import check_name
from memt_core.request_body import read_json
from memt_proxy.errors import BadRequest, BodyTimeout, ProxyError, TooLarge, Unauthorized, from_native
from memt_proxy.request_context import RequestContext
from memt_proxy.session.retries import request_digest

SESSION_HEADER = "X-MemT-Session"
MEMORY_HEADER = "X-MemT-Memory"
DIVERGENCE_HEADER = "X-MemT-On-Divergence"
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_LIMIT = 255
MEMORY_POLICIES = ("auto", "read", "off")
#: each per-request control's header and the key of the body's ``metadata`` that carries it as well
CONTROLS = {MEMORY_HEADER: "memt_memory", DIVERGENCE_HEADER: "memt_on_divergence", IDEMPOTENCY_HEADER: "memt_idempotency_key"}
#: default --max-request-bytes: far above any chat a context window holds, far below what stalls a server
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: default --body-timeout: seconds a client has to send its whole body (408 past it)
DEFAULT_BODY_TIMEOUT = 60.0
_WHERE = re.compile(r"\$((?:\.[^ .\[]+|\[\d+\])*)")

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class Controls:
    """What a request asks of memory beside its body's OpenAI fields, from its headers or its ``metadata``."""

    memory: str | None = None  # auto, read or off (lower case); None: the proxy's --memory default
    on_divergence: str | None = None  # checked by the chat route against the service's choices
    idempotency_key: str | None = None
    retry: bool = False  # the client says it sends this request again (``x-stainless-retry-count`` > 0)


class Inputs:
    """Reads a request's tenant (``api_keys``: key → tenant; without keys every caller is "default"), its
    session header and its bounded JSON body."""

    def __init__(self, api_keys: dict[str, str] | None = None, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT):
        self.api_keys, self.max_request_bytes, self.body_timeout = api_keys, max_request_bytes, body_timeout

    def tenant(self, request: Request) -> str:
        if not self.api_keys:
            return "default"
        if (tenant := keyed(request, self.api_keys)) is None:
            raise Unauthorized("invalid API key; send 'Authorization: Bearer <key>'", code="invalid_api_key")
        return tenant

    @staticmethod
    def session(value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_name(value, SESSION_HEADER)
        except InvalidRequest as exc:
            raise BadRequest(exc.message, param=SESSION_HEADER, code="invalid_session") from None

    @staticmethod
    def controls(request: Request, metadata: Any = None) -> Controls:
        """The request's controls (``CONTROLS``: each a header or its key in the body's ``metadata``), checked:
        the memory policy one of ``MEMORY_POLICIES``, the ``Idempotency-Key`` 1 to 255 characters (a request
        repeating the key of a kept answer is a retry), and whether the client says it retries (the OpenAI SDKs'
        ``x-stainless-retry-count`` > 0)."""
        given = {}
        for header, key in CONTROLS.items():
            sent = request.headers.get(header)
            carried = metadata.get(key) if isinstance(metadata, dict) else None
            if carried is not None and not isinstance(carried, str):
                raise BadRequest(f"metadata.{key} must be a string", param=f"metadata.{key}")
            if sent is not None and carried is not None and sent != carried:
                raise BadRequest(f"{header} and metadata.{key} disagree: send one of them, or the same value", param=header)
            given[header] = (sent if sent is not None else carried, header if sent is not None else f"metadata.{key}")
        memory, where = given[MEMORY_HEADER]
        if memory is not None and memory.lower() not in MEMORY_POLICIES:
            raise BadRequest(f"{where} must be one of {', '.join(MEMORY_POLICIES)}", param=where)
        key, where = given[IDEMPOTENCY_HEADER]
        if key is not None and not 0 < len(key) <= IDEMPOTENCY_KEY_LIMIT:
            raise BadRequest(f"{where} must be 1 to {IDEMPOTENCY_KEY_LIMIT} characters", param=where)
        count = request.headers.get("x-stainless-retry-count", "0").strip()
        return Controls(memory=memory and memory.lower(), on_divergence=given[DIVERGENCE_HEADER][0], idempotency_key=key,
                        retry=count.isdigit() and int(count) > 0)

    async def json(self, request: Request) -> Any:
        """The request's JSON body, read and parsed within the bounds above."""
        try:
            return await read_json(request.stream(), limit=self.max_request_bytes, declared=request.headers.get("content-length"), timeout=self.body_timeout)
        except RequestTimeout:
            raise BodyTimeout(f"the request body did not arrive within {self.body_timeout:g} s (--body-timeout)", code="request_timeout") from None
        except PayloadTooLarge as exc:
            raise TooLarge(f"{exc.message}; send a smaller request, or raise the proxy's --max-request-bytes", code="request_too_large") from None
        except InvalidRequest as exc:
            found = _WHERE.search(exc.message)
            param = found.group(1).lstrip(".") if found and found.group(1) else None
            raise BadRequest(exc.message, param=param, code="invalid_json") from None

    async def model(self, request: Request, model: type[Model], *, empty: Model | None = None) -> Model:
        """The body validated as ``model`` (``empty`` stands for an absent body, where one may be)."""
        if empty is not None and not _has_body(request):
            return empty
        body = await self.json(request)
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = _field_path(body, first.get("loc", ())) or None
            raise BadRequest(f"invalid request: {param}: {first.get('msg')}", param=param) from None


def request_context(tenant: str, body: BaseModel, controls: Controls, default_memory: str) -> RequestContext:
    """The context of a request with ``body`` (either surface's model), built once: its tenant, its memory policy (the
    control, else the proxy's ``default_memory``, --memory), its JSON dumped once for its size (where its prompt is
    prepared, ``worker.off_loop``) and its digest (a retry of the same request has the same), and its retry controls."""
    dumped = body.model_dump_json()
    return RequestContext(tenant, (controls.memory or default_memory).lower(), len(dumped), request_digest(dumped), controls.retry, controls.idempotency_key)


def keyed(request: Request, keys) -> Any:
    """What ``keys`` (key → value, or a list of keys) holds for the request's bearer token; None without a match."""
    return matching(bearer_token(request.headers.get("authorization")), keys)


def request_body(model: type[BaseModel], *, required: bool = True) -> dict:
    """The OpenAPI ``requestBody`` of a route that reads its JSON itself: ``model``'s schema, inlined."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return {"requestBody": {"required": required, "content": {"application/json": {"schema": inline(schema)}}}}


async def sse(chunks, observe_error):
    """``data: <chunk>`` frames then ``data: [DONE]``; an error mid-stream becomes an error frame (and is
    told to ``observe_error``)."""
    error = None
    try:
        async for chunk in chunks:
            yield {"data": json.dumps(chunk, ensure_ascii=False)}
    except ProxyError as exc:
        error = exc
    except MemTClientError as exc:  # mapped where it enters; this is the last line of defence
        error = from_native(exc)
    if error is not None:
        observe_error(error)
        yield {"data": json.dumps(error.body())}
    yield {"data": "[DONE]"}


def _has_body(request: Request) -> bool:
    """Whether the request declares or carries a body (an optional body may be left out)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        return declared.strip() != "0"
    return "transfer-encoding" in request.headers


def _field_path(body: Any, loc: tuple) -> str:
    """The dotted path of a validation error's field in ``body``: pydantic's ``loc`` without the names it
    gives the members of a union (``literal[...]``, ``NamedToolChoice``), which are not fields."""
    parts, node = [], body
    for index, item in enumerate(loc):
        if isinstance(node, dict) and item in node:
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
        elif not (isinstance(node, dict) and index == len(loc) - 1):
            continue  # a union member's tag; a missing field (the last item) is named
        parts.append(str(item))
    return ".".join(parts)
