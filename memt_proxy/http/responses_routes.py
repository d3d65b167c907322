"""FastAPI routes of the Responses and Conversations APIs: thin adapters over ``ResponsesService``.

Added to the proxy's app by ``create_app`` with its request ``Inputs``, so that auth, request limits and
error bodies are the chat path's. Streams are SSE as OpenAI sends them: ``event: <type>``
and ``data: <event>`` per event, ending when the response is done (no ``[DONE]`` sentinel).
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Query, Request
from sse_starlette.sse import EventSourceResponse

from memt_core.client.errors import MemTClientError
from memt_proxy.errors import BadRequest, ProxyError, from_native
from memt_proxy.http.metrics import ProxyMetrics
from memt_proxy.responses.service import ResponsesService
from memt_proxy.responses.protocol import ConversationRequest, ItemsRequest, ResponseRequest
from memt_proxy.http.route_inputs import Inputs, request_body, request_context

ORDER = Query(default="desc", pattern="^(asc|desc)$")
LIMIT = Query(default=20, ge=1, le=100)


def add_responses_routes(app: FastAPI, service: ResponsesService, inputs: Inputs, metrics: ProxyMetrics) -> None:
    """The routes read requests through ``inputs`` (tenant, bounded JSON body), as the chat routes do; an error
    event in a stream is counted in ``metrics``."""

    @app.post("/v1/responses", tags=["responses"], summary="Create a response (conversation / previous_response_id continue latent memory)",
              openapi_extra=request_body(ResponseRequest))
    async def create(request: Request):
        tenant = inputs.tenant(request)
        body = await inputs.model(request, ResponseRequest)
        controls = inputs.controls(request, body.metadata)
        result = await service.create(body, request_context(tenant, body, controls, service.default_memory))
        if isinstance(result, dict):
            return result
        return EventSourceResponse(_sse(result, metrics.observe_stream_error), sep="\n", ping=15)

    @app.get("/v1/responses/{response_id}", tags=["responses"], summary="A stored response")
    async def get(response_id: str, request: Request) -> dict:
        return service.stored.get(inputs.tenant(request), response_id)

    @app.delete("/v1/responses/{response_id}", tags=["responses"], summary="Delete a stored response")
    async def delete(response_id: str, request: Request) -> dict:
        return service.stored.delete(inputs.tenant(request), response_id)

    @app.get("/v1/responses/{response_id}/input_items", tags=["responses"], summary="The input items of a stored response")
    async def input_items(response_id: str, request: Request, after: str | None = None, limit: int = LIMIT, order: str = ORDER) -> dict:
        return service.stored.input_items(inputs.tenant(request), response_id, after=after, limit=limit, order=order)

    @app.post("/v1/conversations", tags=["conversations"], summary="Create a conversation (a new memory session)",
              openapi_extra=request_body(ConversationRequest, required=False))
    async def create_conversation(request: Request) -> dict:
        tenant = inputs.tenant(request)
        body = await inputs.model(request, ConversationRequest, empty=ConversationRequest())
        return service.stored.create_conversation(tenant, body)

    @app.get("/v1/conversations/{conversation_id}", tags=["conversations"], summary="A conversation")
    async def conversation(conversation_id: str, request: Request) -> dict:
        return service.stored.conversation(inputs.tenant(request), conversation_id)

    @app.delete("/v1/conversations/{conversation_id}", tags=["conversations"], summary="Delete a conversation with its memory")
    async def delete_conversation(conversation_id: str, request: Request) -> dict:
        return await service.stored.delete_conversation(inputs.tenant(request), conversation_id)

    @app.get("/v1/conversations/{conversation_id}/items", tags=["conversations"], summary="The items this proxy recorded for a conversation")
    async def items(conversation_id: str, request: Request, after: str | None = None, limit: int = LIMIT, order: str = Query(default="asc", pattern="^(asc|desc)$")) -> dict:
        return service.stored.conversation_items(inputs.tenant(request), conversation_id, after=after, limit=limit, order=order)

    @app.post("/v1/conversations/{conversation_id}/items", tags=["conversations"], summary="Add items (sent and committed with the next response)",
              openapi_extra=request_body(ItemsRequest))
    async def add_items(conversation_id: str, request: Request) -> dict:
        tenant = inputs.tenant(request)
        body = await inputs.model(request, ItemsRequest)
        return await service.stored.add_items(tenant, conversation_id, body.items)


async def _sse(events, observe_error):
    """``event: <type>`` + ``data: <event>`` frames; a failure mid-stream becomes an ``error`` event (each told to
    ``observe_error``)."""
    try:
        async for event in events:
            if event["type"] == "error":
                observe_error(BadRequest(event.get("message") or "", code=event.get("code")))  # its status is gone: only the code is counted
            yield {"event": event["type"], "data": json.dumps(event, ensure_ascii=False)}
    except (ProxyError, MemTClientError) as exc:
        error = exc if isinstance(exc, ProxyError) else from_native(exc)
        observe_error(error)
        yield {"event": "error", "data": json.dumps({"type": "error", "code": error.code, "message": error.message, "param": error.param, "sequence_number": -1})}
