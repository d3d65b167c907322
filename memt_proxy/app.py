"""FastAPI routes of the OpenAI-compatible proxy: thin adapters over ``ChatService`` and its session layer."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging

from fastapi import Body, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from memt_core.protocol.events import check_name, check_snapshot_name
from memt_core.errors import InvalidRequest
from memt_proxy.errors import ProxyError
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.serving import ChatService

log = logging.getLogger("memt.proxy")
SESSION_HEADER = "X-MemT-Session"
MEMORY_HEADER = "X-MemT-Memory"
DIVERGENCE_HEADER = "X-MemT-On-Divergence"


class SnapshotRequest(BaseModel):
    name: str | None = None
    overwrite: bool = False


class RestoreRequest(BaseModel):
    name: str


def create_app(service: ChatService, *, api_keys: dict[str, str] | None = None) -> FastAPI:
    """``api_keys`` maps key → tenant; without keys every caller is tenant "default"."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await service.sessions.client.aclose()  # the upstream connections

    app = FastAPI(
        lifespan=lifespan,
        title="MemT OpenAI-compatible proxy",
        description=(
            "OpenAI chat completions with latent memory. Send `X-MemT-Session: <id>` to give a conversation "
            "memory and `X-MemT-Memory: auto|read|off` to choose the policy."
        ),
    )

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

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> JSONResponse:
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

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        tenant_of(request)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "memt"} for name in service.model_names]}

    @app.post("/v1/chat/completions")
    async def chat_completions(
        request: Request,
        x_memt_session: str | None = Header(default=None, alias=SESSION_HEADER),
        x_memt_memory: str | None = Header(default=None, alias=MEMORY_HEADER),
        x_memt_on_divergence: str | None = Header(default=None, alias=DIVERGENCE_HEADER),
    ):
        tenant = tenant_of(request)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProxyError(400, f"the request body is not valid JSON: {exc}") from None
        try:
            completion = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            raise ProxyError(400, f"invalid request: {param}: {first.get('msg')}", param=param) from None
        if x_memt_on_divergence not in (None, "reject", "reset"):
            raise ProxyError(400, f"{DIVERGENCE_HEADER} must be 'reject' or 'reset'", param=DIVERGENCE_HEADER)
        result = await service.complete(
            completion, tenant=tenant, session=session_of(x_memt_session), memory=x_memt_memory, on_divergence=x_memt_on_divergence
        )
        if isinstance(result, dict):
            return result
        return EventSourceResponse(_sse(result), sep="\n", ping=15)

    sessions = "/v1/memt/sessions/{session}"

    @app.get(sessions, summary="Inspect a session", tags=["sessions"])
    async def inspect(session: str, request: Request) -> dict:
        return await service.sessions.admin(tenant_of(request), session_of(session), "inspect")

    @app.post(sessions + "/snapshots", summary="Save the session's memory as a snapshot", tags=["sessions"])
    async def save(session: str, request: Request, body: SnapshotRequest = Body(default_factory=SnapshotRequest)) -> dict:
        _snapshot_name(body.name, required=False)
        return await service.sessions.admin(tenant_of(request), session_of(session), "save", name=body.name, overwrite=body.overwrite)

    @app.post(sessions + "/restore", summary="Restore a snapshot into the session (replaces its memory)", tags=["sessions"])
    async def restore(session: str, body: RestoreRequest, request: Request) -> dict:
        _snapshot_name(body.name, required=True)
        return await service.sessions.admin(tenant_of(request), session_of(session), "restore", name=body.name)

    @app.post(sessions + "/reset", summary="Clear the session's memory", tags=["sessions"])
    async def reset(session: str, request: Request) -> dict:
        return await service.sessions.admin(tenant_of(request), session_of(session), "reset")

    @app.delete(sessions, summary="Close (delete) the session", tags=["sessions"])
    async def close(session: str, request: Request) -> dict:
        return await service.sessions.admin(tenant_of(request), session_of(session), "close")

    return app


def _snapshot_name(name: str | None, *, required: bool) -> None:
    if name is None and not required:
        return
    try:
        check_snapshot_name(name)
    except InvalidRequest as exc:
        raise ProxyError(400, exc.message, param="name", code="invalid_snapshot_name") from None


async def _sse(chunks):
    """``data: <chunk>`` frames then ``data: [DONE]``; an error mid-stream becomes an error frame."""
    try:
        async for chunk in chunks:
            yield {"data": json.dumps(chunk, ensure_ascii=False)}
    except ProxyError as exc:
        yield {"data": json.dumps(exc.body())}
    yield {"data": "[DONE]"}
