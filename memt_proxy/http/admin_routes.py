"""FastAPI routes of the session admin extension (``/v1/memt/sessions/{id}``): inspect, snapshots, reset, close."""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from memt_proxy.http.route_inputs import Inputs, request_body
from memt_proxy.chat.service import ChatService


class SnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    overwrite: bool = False


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


def add_session_routes(app: FastAPI, service: ChatService, inputs: Inputs) -> None:
    sessions = "/v1/memt/sessions/{session}"

    @app.get(sessions, summary="Inspect a session", tags=["sessions"])
    async def inspect(session: str, request: Request) -> dict:
        return await service.sessions.admin(inputs.tenant(request), inputs.session(session), "inspect")

    @app.post(sessions + "/snapshots", summary="Save the session's memory as a snapshot (a name of this tenant's)", tags=["sessions"],
              openapi_extra=request_body(SnapshotRequest, required=False))
    async def save(session: str, request: Request) -> dict:
        tenant = inputs.tenant(request)
        body = await inputs.model(request, SnapshotRequest, empty=SnapshotRequest())
        return await service.sessions.admin(tenant, inputs.session(session), "save", name=body.name, overwrite=body.overwrite)

    @app.post(sessions + "/restore", summary="Restore one of this tenant's snapshots into the session (replaces its memory)", tags=["sessions"],
              openapi_extra=request_body(RestoreRequest))
    async def restore(session: str, request: Request) -> dict:
        tenant = inputs.tenant(request)
        body = await inputs.model(request, RestoreRequest)
        return await service.sessions.admin(tenant, inputs.session(session), "restore", name=body.name)

    @app.post(sessions + "/reset", summary="Clear the session's memory", tags=["sessions"])
    async def reset(session: str, request: Request) -> dict:
        return await service.sessions.admin(inputs.tenant(request), inputs.session(session), "reset")

    @app.delete(sessions, summary="Close (delete) the session", tags=["sessions"])
    async def close(session: str, request: Request) -> dict:
        return await service.sessions.admin(inputs.tenant(request), inputs.session(session), "close")
