"""The proxy's cluster pieces without servers: shared session records, the routing key as the session, drain.

(The live behaviour behind SMG is tests/e2e/test_cluster.py.)
"""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI, Request

from memt_core.client.native import AsyncNativeClient
from memt_proxy.http.cluster import install
from memt_proxy.session.sessions import Sessions
from memt_proxy.session.store import SessionRecordStore

A, B = "a" * 64, "b" * 64


def test_records_in_a_shared_directory_are_read_by_another_proxy(tmp_path):
    """Per-session records go to the records directory, where another node's proxy finds them; offload records
    (naming one upstream's snapshot files) stay in the proxy's own state directory."""
    shared = tmp_path / "records"
    here = SessionRecordStore(tmp_path / "node0", shared)
    there = SessionRecordStore(tmp_path / "node1", shared)
    here.save("p-1", 3, [A], [A, B])
    assert there.load("p-1", 4) == [A, B]
    here.save_offload("p-1", "sha256-" + "0" * 64 + ".safetensors", [A], None)
    assert there.load_offload("p-1") is None and here.load_offload("p-1") is not None
    assert sorted(p.name for p in shared.iterdir()) == ["p-1.json"]
    there.delete("p-1")
    assert here.load("p-1", 4) is None


def test_a_records_directory_alone_keeps_offloads_in_memory(tmp_path):
    store = SessionRecordStore(None, tmp_path)
    store.save("p-1", 0, [], [A])
    store.save_offload("p-1", "sha256-" + "1" * 64 + ".safetensors", [A], None)
    assert store.load("p-1", 1) == [A] and store.load_offload("p-1")["committed"] == [A]
    assert [p.name for p in tmp_path.iterdir()] == ["p-1.json"]


def node_app():
    """A stand-in for the proxy's routes (the session header echoed; /slow waits to be let go), as a cluster node."""
    app = FastAPI()
    release = asyncio.Event()

    @app.get("/health/ready")
    async def ready() -> dict:
        return {"status": "ready"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        return {"session": request.headers.get("x-memt-session")}

    @app.post("/slow")
    async def slow() -> dict:
        await release.wait()
        return {"done": True}

    sessions = Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=None)  # never called: no session is held
    node = install(app, sessions, api_keys={"k": "default"}, admin_keys=["operator"])
    return app, node, release


def run(coroutine):
    return asyncio.run(coroutine)


def test_the_routing_key_becomes_the_session_unless_it_contradicts_it():
    app, _, _ = node_app()

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
            keyed = await http.post("/v1/chat/completions", headers={"X-SMG-Routing-Key": "alice"})
            both = await http.post("/v1/chat/completions", headers={"X-SMG-Routing-Key": "alice", "X-MemT-Session": "alice"})
            neither = await http.post("/v1/chat/completions")
            clash = await http.post("/v1/chat/completions", headers={"X-SMG-Routing-Key": "alice", "X-MemT-Session": "bob"})
        return keyed, both, neither, clash

    keyed, both, neither, clash = run(go())
    assert keyed.json() == both.json() == {"session": "alice"}
    assert neither.json() == {"session": None}
    assert clash.status_code == 400 and clash.json()["error"]["param"] == "X-SMG-Routing-Key"


def test_a_drain_waits_for_the_requests_under_way_then_refuses_and_fails_readiness():
    app, node, release = node_app()

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
            unauthorized = await http.post("/admin/drain")
            tenant = await http.post("/admin/drain", headers={"Authorization": "Bearer k"})  # a tenant's key: refused (issue 38)
            slow = asyncio.create_task(http.post("/slow"))
            while node.in_flight == 0:  # the slow request is being served
                await asyncio.sleep(0.01)
            drain = asyncio.create_task(http.post("/admin/drain", headers={"Authorization": "Bearer operator"}))
            while not node.draining:
                await asyncio.sleep(0.01)
            refused = await http.post("/v1/chat/completions")
            not_ready = await http.get("/health/ready")
            assert not drain.done()  # still waiting for the slow request
            release.set()
            return unauthorized, tenant, await slow, await drain, refused, not_ready

    unauthorized, tenant, slow, drained, refused, not_ready = run(go())
    assert unauthorized.status_code == 401
    assert tenant.status_code == 403 and tenant.json()["error"]["code"] == "forbidden"
    assert slow.json() == {"done": True}
    assert drained.status_code == 200 and drained.json()["drained"] is True
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining" and refused.headers["retry-after"] == "1"
    assert not_ready.status_code == 503


def test_undrain_takes_requests_again_with_the_operator_key_only():
    app, node, release = node_app()

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as http:
            operator = {"Authorization": "Bearer operator"}
            await http.post("/admin/drain", headers=operator)
            tenant = await http.post("/admin/undrain", headers={"Authorization": "Bearer k"})
            still = await http.get("/health/ready")
            undrained = await http.post("/admin/undrain", headers=operator)
            return tenant, still, undrained, await http.get("/health/ready")

    tenant, still, undrained, ready = run(go())
    assert tenant.status_code == 403 and still.status_code == 503  # a tenant's key changes nothing
    assert undrained.json() == {"draining": False} and not node.draining
    assert ready.status_code != 503


def controls(headers: dict[str, str] | None = None, metadata=None):
    """``Inputs.controls`` of a request with ``headers`` and a body whose ``metadata`` is ``metadata``."""
    from starlette.requests import Request as Bare

    from memt_proxy.http.route_inputs import Inputs

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]}
    return Inputs.controls(Bare(scope), metadata)


def test_every_control_is_a_header_or_the_same_key_in_the_body_metadata():
    """SMG forwards the body's metadata and drops X-MemT-* and Idempotency-Key (tests/e2e/test_cluster.py): each
    control is read from either, and the two may only agree."""
    import pytest

    from memt_proxy.errors import BadRequest

    assert controls() == controls(metadata={"other": "x"}) == controls(metadata="not an object")
    by_header = controls({"X-MemT-Memory": "OFF", "X-MemT-On-Divergence": "error", "Idempotency-Key": "k-1", "x-stainless-retry-count": "1"})
    by_body = controls({"x-stainless-retry-count": "1"}, {"memt_memory": "off", "memt_on_divergence": "error", "memt_idempotency_key": "k-1"})
    assert by_header == by_body and (by_body.memory, by_body.on_divergence, by_body.idempotency_key, by_body.retry) == ("off", "error", "k-1", True)
    assert controls({"X-MemT-Memory": "read"}, {"memt_memory": "read"}).memory == "read"
    for headers, metadata, param in (
        ({"X-MemT-Memory": "off"}, {"memt_memory": "auto"}, "X-MemT-Memory"),  # disagree
        ({}, {"memt_memory": "all"}, "metadata.memt_memory"),
        ({}, {"memt_memory": 0}, "metadata.memt_memory"),
        ({}, {"memt_idempotency_key": ""}, "metadata.memt_idempotency_key"),
        ({"Idempotency-Key": "x" * 256}, None, "Idempotency-Key"),
    ):
        with pytest.raises(BadRequest) as refused:
            controls(headers, metadata)
        assert refused.value.param == param, (headers, metadata)
