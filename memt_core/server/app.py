"""FastAPI routes of memt-http-v1: a thin adapter from HTTP to ``MemTService``.

Parse the body, call the service, serialise the answer; every ``MemTError`` becomes its status with
``{"error": {"type", "message", "code"}}``, and any other exception a 500 in the same shape (``last_resort``: code
``internal_error``, its trace logged once, the connection kept). No protocol rule lives here.

``spec_strict`` (``--spec-strict``) leaves out everything this server adds to what the memt-http-v1 spec
promises, so that clients can be tested against exactly the spec: errors carry only ``type`` and
``message`` with the spec's statuses, and identity, capabilities and control answers only the spec's fields.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from memt_core.bearer import bearer_token, matching
from memt_core.errors import WIRE_TYPE, AuthenticationError, MemTError, RouteDisabled, WorkerUnavailable
from memt_core.request_body import parse_json, read_json
from memt_core.server.openapi_bodies import CONTROL, GENERATE, request_body
from memt_core.server.docs import offline_docs
from memt_core.server.last_resort import LastResort
from memt_core.server.metrics import CONTENT_TYPE, Metrics
from memt_core.server.service import MemTService

#: Administrative routes of SGLang that a MemT server keeps disabled (they would bypass memory rules).
log = logging.getLogger("memt.server")
DISABLED_ROUTES = (
    "/update_weights_from_disk", "/update_weights_from_tensor", "/update_weights_from_distributed",
    "/init_weights_update_group", "/flush_cache", "/load_lora_adapter", "/unload_lora_adapter",
    "/release_memory_occupation", "/resume_memory_occupation",
)


#: Statuses the spec gives MemT errors (401/404/405 are plain HTTP); others become 400 in spec-strict mode.
SPEC_STATUSES = {400, 401, 404, 405, 409, 429, 502, 503}
#: The spec's capabilities and identity fields (``epoch`` is added per request).
SPEC_CAPABILITIES = ("protocol", "snapshot_format", "chunk_tokens", "max_prefill_tokens", "streaming", "retain_kv")
SPEC_IDENTITY = ("model", "config_sha256", "checkpoint_id", "sglang_version", "memt_runtime")
#: Fields this server adds to control answers.
EXTENSION_FIELDS = ("restored_version", "reads")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_BODY_TIMEOUT = 60.0


def create_app(
    service: MemTService, *, identity: dict, capabilities: dict, api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, body_timeout: float = DEFAULT_BODY_TIMEOUT,
    spec_strict: bool = False,
) -> FastAPI:
    """The HTTP application for one service (``spec_strict``: see the module docstring)."""
    # with an API key every route but /health needs it, so the unauthenticated docs routes go
    app = FastAPI(
        title="MemT serve — memt-http-v1",
        version=identity.get("extra", {}).get("engine_version", ""),
        description="Native MemT protocol: sessions, leases, transactions and snapshots over latent memory.",
        docs_url=None, redoc_url=None, openapi_url=None if api_key is not None else "/openapi.json",
    )
    if api_key is None:
        offline_docs(app, title="MemT serve — memt-http-v1")
    metrics = Metrics(service)
    app.add_middleware(LastResort, log=log, body=lambda exc: internal_error(exc, spec_strict=spec_strict))

    async def authorised(request: Request) -> None:
        if api_key is None:
            return
        if matching(bearer_token(request.headers.get("authorization")), [api_key]) is None:
            raise AuthenticationError("missing or invalid API key; send 'Authorization: Bearer <key>'")

    guard = [Depends(authorised)]

    @app.exception_handler(MemTError)
    async def memt_error(request: Request, exc: MemTError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        if getattr(exc, "retry_after", None) is not None:  # EngineBusy: the queue is full
            headers = {"Retry-After": str(exc.retry_after)}
        return JSONResponse(wire(exc), status_code=exc.status if not spec_strict or exc.status in SPEC_STATUSES else 400, headers=headers)

    def wire(exc: MemTError) -> dict:
        body = exc.to_wire()
        if spec_strict:
            del body["error"]["code"]
        return body

    if spec_strict:
        identity = {key: identity.get(key) for key in SPEC_IDENTITY}
        capabilities = {key: capabilities[key] for key in SPEC_CAPABILITIES}

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # unknown routes (404) and methods (405) answer the same error body as every other refusal
        message = f"{request.method} {_shown(request.url.path)}: {exc.detail}"
        if exc.status_code == 404 and request.url.path.startswith("/v1/"):
            message += (
                " — this is the native memt-http-v1 server; the OpenAI-compatible API (/v1/chat/completions, "
                "/v1/models, …) is served by memt_proxy: python -m memt_proxy --upstream <this server's URL>"
            )
        body = {"error": {"type": WIRE_TYPE, "message": message}}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    async def json_body(request: Request) -> Any:
        return await read_json(request.stream(), limit=max_body_bytes, declared=request.headers.get("content-length"), timeout=body_timeout)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not service.engine.alive:
            raise WorkerUnavailable("the engine worker is not running")
        if not service.engine.ready:  # ready once the served shapes have run (memt_core.engine.warmup)
            progress = service.engine.warmup_progress()
            detail = ", ".join(f"{key} {value}" for key, value in progress.items())
            raise WorkerUnavailable(f"the engine is warming up{f' ({detail})' if detail else ''}; ready when this answers 200")
        return JSONResponse({"status": "ok"})

    @app.get("/memt/identity", dependencies=guard)
    async def get_identity() -> dict:
        return identity

    @app.get("/memt/capabilities", dependencies=guard)
    async def get_capabilities() -> dict:
        return {**capabilities, "epoch": service.protocol.epoch}

    @app.post("/memt/control", dependencies=guard, openapi_extra=request_body(CONTROL))
    async def control(request: Request) -> dict:
        answer = await service.control(await json_body(request))
        if spec_strict:
            for field in EXTENSION_FIELDS:
                answer.pop(field, None)
        return answer

    @app.post("/generate", dependencies=guard, openapi_extra=request_body(GENERATE))
    async def generate(request: Request):
        result = await service.generate(await json_body(request))
        if isinstance(result, dict):
            return result
        return EventSourceResponse(_sse(result, wire), sep="\n", ping=15)

    @app.get("/metrics", dependencies=guard)
    async def get_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    for path in DISABLED_ROUTES:
        app.add_api_route(path, _disabled(path), methods=["GET", "POST"], dependencies=guard, include_in_schema=False)
    return app


def internal_error(exc: BaseException, *, spec_strict: bool = False) -> dict:
    """The 500 body of an exception no handler took: the error shape, naming nothing internal but its class."""
    error = {"type": WIRE_TYPE, "message": f"internal error ({type(exc).__name__}); the server logged it"}
    return {"error": error if spec_strict else {**error, "code": "internal_error"}}


async def route_answer(call, data: bytes, stage: str) -> tuple[int, Any]:
    """(status, body) the control or generate route answers for the body ``data`` when ``call`` is the service
    method it wraps (non-streamed, not ``--spec-strict``): for an in-process caller (``memt_proxy.http.embedded``)."""
    try:
        answer = await call(parse_json(data))
        text = json.dumps(jsonable_encoder(answer), allow_nan=False)  # as the route's JSON response writes it
    except MemTError as exc:
        return exc.status, exc.to_wire()
    except Exception as exc:  # what the app's last resort answers
        log.exception("the embedded core failed on %s", stage)
        return 500, internal_error(exc)
    return 200, json.loads(text)


async def _sse(bodies, wire):
    """Stream bodies as ``data: <json>`` frames, then ``data: [DONE]``; errors become a final error frame."""
    try:
        async for body in bodies:
            yield {"data": json.dumps(body, ensure_ascii=False)}
    except MemTError as exc:
        yield {"data": json.dumps(wire(exc))}
        return
    yield {"data": "[DONE]"}


def _shown(path: str, limit: int = 200) -> str:
    """A request path as an error message quotes it: a long one cut to ``limit`` characters, with its length."""
    return path if len(path) <= limit else f"{path[:limit]}… ({len(path)} characters)"


def _disabled(path: str):
    async def refuse() -> None:
        raise RouteDisabled(f"{path} is disabled on MemT servers: it would bypass session memory rules")

    return refuse
