"""The OpenAI-compatible proxy's FastAPI app: health, metrics and docs here, the API's routes by surface.

Routes are thin adapters over the services: ``chat_routes`` (Chat Completions, models), ``admin_routes``
(session admin), ``responses_routes`` (Responses, Conversations), each reading requests through one
``route_inputs.Inputs`` (tenant, session header, bounded JSON body). Every error answers in OpenAI's shape, an
exception no handler takes too (``memt_core.server.last_resort``: a 500 ``internal_error``, its trace logged once).
With API keys, every route but the two health checks needs one, the OpenAPI document, its docs page and
``/metrics`` (``memt_proxy.http.metrics``) included, as on the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from memt_core.server.docs import mount_assets, swagger_page
from memt_core.server.last_resort import LastResort
from memt_proxy.http.admin_routes import add_session_routes
from memt_proxy.http.chat_routes import add_chat_routes
from memt_proxy.errors import BadRequest, Forbidden, InternalError, ProxyError, Unavailable
from memt_proxy.http.metrics import CONTENT_TYPE, CountRequests, ProxyMetrics
from memt_proxy.responses.service import ResponsesService
from memt_proxy.http.responses_routes import add_responses_routes
from memt_proxy.http.route_inputs import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES, Inputs, keyed
from memt_proxy.chat.service import ChatService

log = logging.getLogger("memt.proxy")
#: seconds /health/ready waits for the upstream's capabilities
READY_TIMEOUT = 5.0

__all__ = ["DEFAULT_BODY_TIMEOUT", "DEFAULT_MAX_REQUEST_BYTES", "create_app"]


def create_app(
    service: ChatService, *, api_keys: dict[str, str] | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, body_timeout: float = DEFAULT_BODY_TIMEOUT,
    responses: ResponsesService | None = None, admin_keys: list[str] = (),
) -> FastAPI:
    """``api_keys`` maps key → tenant; without keys every caller is tenant "default"; ``admin_keys`` are the
    operator's, which alone read the node-wide ``/metrics`` when given; ``responses`` adds the Responses and
    Conversations APIs."""

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
    inputs = Inputs(api_keys, max_request_bytes=max_request_bytes, body_timeout=body_timeout)
    metrics = ProxyMetrics(service.sessions)
    service.runner.on_usage = metrics.observe_usage
    if responses is not None:
        responses.runner.on_usage = metrics.observe_usage  # the Responses API's completions count alike (often one runner)
    # inside the request count, so that its 500 is counted
    app.add_middleware(LastResort, body=lambda exc: InternalError(f"internal error ({type(exc).__name__}); the proxy logged it", code="internal_error").body(), log=log)
    app.add_middleware(CountRequests, metrics=metrics)
    _add_error_handlers(app, metrics)

    @app.get("/health", summary="Liveness: the proxy process answers (cheap; asks nobody)", tags=["health"])
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/health/ready", summary="Readiness: the upstream MemT server answers and serves this proxy's model", tags=["health"])
    async def ready() -> dict:
        try:
            await asyncio.wait_for(service.sessions.check_upstream(refresh=True), READY_TIMEOUT)
        except asyncio.TimeoutError:
            raise Unavailable(f"not ready: the upstream MemT server did not answer within {READY_TIMEOUT:g} s", code="upstream_timeout") from None
        except ProxyError as exc:
            raise Unavailable(f"not ready: {exc.message}", code=exc.code or "upstream_unavailable") from None
        return {"status": "ready"}

    mount_assets(app)

    @app.get("/metrics", summary="Prometheus metrics: requests, latency, tokens, memory savings, sessions, upstream errors", tags=["health"])
    async def get_metrics(request: Request) -> Response:
        # node-wide counts: the operator's alone when an operator key is set (a tenant sees 403), else any key's
        if admin_keys and keyed(request, list(admin_keys)) is None:
            inputs.tenant(request)  # 401 for no key or an unknown one
            raise Forbidden("/metrics shows every tenant's figures: it needs the operator key (--admin-key)", code="forbidden")
        if not admin_keys:
            inputs.tenant(request)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        inputs.tenant(request)
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        inputs.tenant(request)
        return swagger_page("/openapi.json", app.title)  # Swagger UI from the installed package: works offline

    add_chat_routes(app, service, inputs, metrics)
    add_session_routes(app, service, inputs)
    if responses is not None:
        add_responses_routes(app, responses, inputs, metrics)
    return app


RETRY_AFTER_SECONDS = 1  # a 429's Retry-After (the OpenAI SDKs wait that long before their automatic retry)


def _add_error_handlers(app: FastAPI, metrics: ProxyMetrics) -> None:
    """Every refusal in OpenAI's error shape: ours, unknown routes and methods, FastAPI's own validation."""

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> JSONResponse:
        metrics.observe_error(exc)
        # no room now (sessions or states in use, a slot still leased by a client gone a moment ago; the core's queue
        # full or the upstream not ready): worth a retry soon
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status in (429, 503) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = ProxyError(
            exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code="not_found" if exc.status_code == 404 else None,
            type="invalid_request_error" if exc.status_code < 500 else None,
        )
        return JSONResponse(error.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(BadRequest(f"invalid request: {first.get('msg', exc)}", param=param).body(), status_code=400)
