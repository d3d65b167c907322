"""FastAPI routes of the OpenAI-compatible proxy: thin adapters over ``ChatService`` and its session layer.

Every JSON body is read through ``memt_core.request_body``: at most ``max_request_bytes`` (413 past it,
refused from ``Content-Length`` before anything is read), parsed with bounded integers, nesting and valid
Unicode (400 naming where), a large one parsed off the event loop, and then validated by a pydantic
model of ``memt_proxy.protocol`` (400 naming the field). With API keys, every route but the two health
checks needs one, the OpenAPI document, its docs page and ``/metrics`` (``memt_proxy.metrics``) included,
as on the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
from typing import Any, TypeVar

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from memt_core.client.errors import MemTClientError
from memt_core.errors import InvalidRequest, PayloadTooLarge, RequestTimeout
from memt_core.protocol.events import check_name
from memt_core.request_body import read_json
from memt_core.server.docs import mount_assets, swagger_page
from memt_proxy.errors import ProxyError, from_native
from memt_proxy.metrics import CONTENT_TYPE, CountRequests, ProxyMetrics
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.responses import ResponsesService
from memt_proxy.responses_routes import add_responses_routes
from memt_proxy.serving import DIVERGENCE, ChatService

log = logging.getLogger("memt.proxy")
SESSION_HEADER = "X-MemT-Session"
MEMORY_HEADER = "X-MemT-Memory"
DIVERGENCE_HEADER = "X-MemT-On-Divergence"
#: default --max-request-bytes: far above any chat a context window holds, far below what stalls a server
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: default --body-timeout: seconds a client has to send its whole body (408 past it)
DEFAULT_BODY_TIMEOUT = 60.0
#: seconds /health/ready waits for the upstream's capabilities
READY_TIMEOUT = 5.0
_WHERE = re.compile(r"\$((?:\.[^ .\[]+|\[\d+\])*)")

Model = TypeVar("Model", bound=BaseModel)


class SnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    overwrite: bool = False


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


def create_app(
    service: ChatService, *, api_keys: dict[str, str] | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, body_timeout: float = DEFAULT_BODY_TIMEOUT,
    responses: ResponsesService | None = None, admin_keys: list[str] = (),
) -> FastAPI:
    """``api_keys`` maps key → tenant; without keys every caller is tenant "default"; ``admin_keys`` are the
    operator's, which alone read the node-wide ``/metrics`` when given; ``responses`` adds the Responses and
    Conversations APIs (``memt_proxy.responses_routes``)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await service.sessions.aclose()  # lease keepers, then the upstream connections

    app = FastAPI(
        lifespan=lifespan,
        title="MemT OpenAI-compatible proxy",
        description=(
            "OpenAI chat completions with latent memory. Send `X-MemT-Session: <id>` to give a conversation "
            "memory and `X-MemT-Memory: auto|read|off` to choose the policy."
        ),
        docs_url=None,  # served below, behind the API key
        redoc_url=None,
        openapi_url=None,
    )
    metrics = ProxyMetrics(service.sessions)
    service.on_usage = metrics.observe_usage
    if responses is not None:
        responses.on_usage = metrics.observe_usage  # the Responses API's completions count alike
    app.add_middleware(CountRequests, metrics=metrics)

    def tenant_of(request: Request) -> str:
        if not api_keys:
            return "default"
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        for key, tenant in api_keys.items():
            if scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode()):
                return tenant
        raise ProxyError(401, "invalid API key; send 'Authorization: Bearer <key>'", code="invalid_api_key")

    def session_of(value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_name(value, SESSION_HEADER)
        except InvalidRequest as exc:
            raise ProxyError(400, exc.message, param=SESSION_HEADER, code="invalid_session") from None

    async def json_body(request: Request) -> Any:
        """The request's JSON body, read and parsed within the bounds above."""
        try:
            return await read_json(request.stream(), limit=max_request_bytes, declared=request.headers.get("content-length"), timeout=body_timeout)
        except RequestTimeout:
            raise ProxyError(408, f"the request body did not arrive within {body_timeout:g} s (--body-timeout)", code="request_timeout") from None
        except PayloadTooLarge as exc:
            raise ProxyError(413, f"{exc.message}; send a smaller request, or raise the proxy's --max-request-bytes", code="request_too_large") from None
        except InvalidRequest as exc:
            found = _WHERE.search(exc.message)
            param = found.group(1).lstrip(".") if found and found.group(1) else None
            raise ProxyError(400, exc.message, param=param, code="invalid_json") from None

    async def model_body(request: Request, model: type[Model], *, empty: Model | None = None) -> Model:
        """The body validated as ``model`` (``empty`` stands for an absent body, where one may be)."""
        if empty is not None and not await _has_body(request):
            return empty
        body = await json_body(request)
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = _field_path(body, first.get("loc", ())) or None
            raise ProxyError(400, f"invalid request: {param}: {first.get('msg')}", param=param) from None

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> JSONResponse:
        metrics.observe_error(exc)
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # unknown routes (404) and methods (405) answer in the same OpenAI error shape
        error = ProxyError(
            exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code="not_found" if exc.status_code == 404 else None,
            type="invalid_request_error" if exc.status_code < 500 else None,
        )
        return JSONResponse(error.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(ProxyError(400, f"invalid request: {first.get('msg', exc)}", param=param).body(), status_code=400)

    @app.get("/health", summary="Liveness: the proxy process answers (cheap; asks nobody)", tags=["health"])
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/health/ready", summary="Readiness: the upstream MemT server answers and serves this proxy's model", tags=["health"])
    async def ready() -> dict:
        try:
            await asyncio.wait_for(service.sessions.check_upstream(refresh=True), READY_TIMEOUT)
        except asyncio.TimeoutError:
            raise ProxyError(503, f"not ready: the upstream MemT server did not answer within {READY_TIMEOUT:g} s", code="upstream_timeout") from None
        except ProxyError as exc:
            raise ProxyError(503, f"not ready: {exc.message}", code=exc.code or "upstream_unavailable") from None
        return {"status": "ready"}

    mount_assets(app)

    @app.get("/metrics", summary="Prometheus metrics: requests, latency, tokens, memory savings, sessions, upstream errors", tags=["health"])
    async def get_metrics(request: Request) -> Response:
        # node-wide counts: the operator's alone when an operator key is set (a tenant sees 403), else any key's
        if admin_keys:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if not (scheme.lower() == "bearer" and any(hmac.compare_digest(token.strip().encode(), key.encode()) for key in admin_keys)):
                tenant_of(request)  # 401 for no key or an unknown one
                raise ProxyError(403, "/metrics shows every tenant's figures: it needs the operator key (--admin-key)", code="forbidden")
        else:
            tenant_of(request)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        tenant_of(request)
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        tenant_of(request)
        return swagger_page("/openapi.json", app.title)  # Swagger UI from the installed package: works offline

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        tenant_of(request)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "memt"} for name in service.model_names]}

    @app.post("/v1/chat/completions", openapi_extra=_request_body(ChatCompletionRequest))
    async def chat_completions(
        request: Request,
        x_memt_session: str | None = Header(default=None, alias=SESSION_HEADER),
        x_memt_memory: str | None = Header(default=None, alias=MEMORY_HEADER),
        x_memt_on_divergence: str | None = Header(default=None, alias=DIVERGENCE_HEADER),
    ):
        tenant = tenant_of(request)
        completion = await model_body(request, ChatCompletionRequest)
        if x_memt_on_divergence not in (None, *DIVERGENCE):
            raise ProxyError(400, f"{DIVERGENCE_HEADER} must be one of {', '.join(DIVERGENCE)}", param=DIVERGENCE_HEADER)
        result = await service.complete(
            completion, tenant=tenant, session=session_of(x_memt_session), memory=x_memt_memory, on_divergence=x_memt_on_divergence
        )
        if isinstance(result, dict):
            return result
        return EventSourceResponse(_sse(result, metrics.observe_error), sep="\n", ping=15)

    sessions = "/v1/memt/sessions/{session}"

    @app.get(sessions, summary="Inspect a session", tags=["sessions"])
    async def inspect(session: str, request: Request) -> dict:
        return await service.sessions.admin(tenant_of(request), session_of(session), "inspect")

    @app.post(sessions + "/snapshots", summary="Save the session's memory as a snapshot (a name of this tenant's)", tags=["sessions"],
              openapi_extra=_request_body(SnapshotRequest, required=False))
    async def save(session: str, request: Request) -> dict:
        tenant = tenant_of(request)
        body = await model_body(request, SnapshotRequest, empty=SnapshotRequest())
        return await service.sessions.admin(tenant, session_of(session), "save", name=body.name, overwrite=body.overwrite)

    @app.post(sessions + "/restore", summary="Restore one of this tenant's snapshots into the session (replaces its memory)", tags=["sessions"],
              openapi_extra=_request_body(RestoreRequest))
    async def restore(session: str, request: Request) -> dict:
        tenant = tenant_of(request)
        body = await model_body(request, RestoreRequest)
        return await service.sessions.admin(tenant, session_of(session), "restore", name=body.name)

    @app.post(sessions + "/reset", summary="Clear the session's memory", tags=["sessions"])
    async def reset(session: str, request: Request) -> dict:
        return await service.sessions.admin(tenant_of(request), session_of(session), "reset")

    @app.delete(sessions, summary="Close (delete) the session", tags=["sessions"])
    async def close(session: str, request: Request) -> dict:
        return await service.sessions.admin(tenant_of(request), session_of(session), "close")

    if responses is not None:
        add_responses_routes(app, responses, tenant_of=tenant_of, model_body=model_body, request_body=_request_body)
    return app


async def _has_body(request: Request) -> bool:
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


def _request_body(model: type[BaseModel], *, required: bool = True) -> dict:
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


async def _sse(chunks, observe_error):
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
