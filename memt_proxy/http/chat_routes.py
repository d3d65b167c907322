"""FastAPI routes of the Chat Completions API and the model list: thin adapters over ``ChatService``."""

from __future__ import annotations

from fastapi import FastAPI, Header, Request
from sse_starlette.sse import EventSourceResponse

from memt_proxy.errors import BadRequest
from memt_proxy.http.metrics import ProxyMetrics
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.http.route_inputs import CONTROLS, DIVERGENCE_HEADER, SESSION_HEADER, Inputs, request_body, request_context, sse
from memt_proxy.chat.service import DIVERGENCE, ChatService


def add_chat_routes(app: FastAPI, service: ChatService, inputs: Inputs, metrics: ProxyMetrics) -> None:
    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        inputs.tenant(request)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "memt"} for name in service.model_names]}

    @app.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(request: Request, x_memt_session: str | None = Header(default=None, alias=SESSION_HEADER)):
        tenant = inputs.tenant(request)
        completion = await inputs.model(request, ChatCompletionRequest)
        controls = inputs.controls(request, completion.metadata)
        if controls.on_divergence not in (None, *DIVERGENCE):
            where = DIVERGENCE_HEADER if DIVERGENCE_HEADER in request.headers else f"metadata.{CONTROLS[DIVERGENCE_HEADER]}"
            raise BadRequest(f"{where} must be one of {', '.join(DIVERGENCE)}", param=where)
        session = inputs.session(x_memt_session)
        context = request_context(tenant, completion, controls, service.default_memory)
        result = await service.complete(completion, context, session=session, on_divergence=controls.on_divergence)
        if isinstance(result, dict):
            return result
        return EventSourceResponse(sse(result, metrics.observe_stream_error), sep="\n", ping=15)
