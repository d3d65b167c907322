"""The proxy as one node of a cluster behind a router (SMG), on cores that share a snapshot store.

Two pieces, switched on by ``--cluster`` (``install``):

* **The session from the routing key.** SMG (the Shepherd Model Gateway) pins a request with a routing-key
  header to one node (``SMG_ROUTING``) and forwards only a short list of headers to its workers —
  ``Authorization``, request ids, trace context and its own ``X-SMG-Routing-Key`` — so ``X-MemT-Session``
  (and every other ``X-MemT-*`` header, and ``Idempotency-Key``) never reaches the proxy. Behind SMG a client
  sends its session as ``X-SMG-Routing-Key`` (SMG routes by it and passes it on) and the other controls in the
  body's ``metadata`` (``route_inputs.CONTROLS``); the middleware gives the request that session. A request
  carrying both headers with different values is refused (400): it would be routed by one name and served
  under another.
* **Planned drain.** ``POST /admin/drain`` (the operator key only: ``--admin-key``) refuses new requests (503 ``draining``, with ``Retry-After``),
  makes ``/health/ready`` fail (the router's health check then stops sending here), waits for the
  requests and commits under way, then hands every session off (``Placement.unload``: its core frees it
  and gives up its ownership; its memory is in the snapshot store), so the node the router picks next
  takes it over at once. ``POST /admin/undrain`` (the same key) takes requests again: the router's health
  check re-admits the node, and sessions come back as they are routed here (from the store).

A session a core restores from the store (``restored_version`` on create) is adopted at its version by
every proxy (``Placement.ensure``), and its record in ``--records-directory`` (a shared filesystem) lets
trimming continue on the new node; the Responses API's stored responses and conversations are kept there
too (``ResponseRecords(shared=True)``), so chains and conversations continue on any node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from memt_core.bearer import bearer_token, matching

log = logging.getLogger("memt.proxy")

#: SMG's routing for a MemT cluster (scripts/start_cluster.sh runs it; scripts/bench/routing.py measured it against
#: consistent hashing and prefix_hash): a request with X-SMG-Routing-Key is pinned to one node by its key (sticky:
#: the node the policy picks for the key's first request); a header-less one goes to the node whose past requests
#: share the longest prefix with it (cache_aware's prefix tree), the node that keeps its conversation's state. No
#: cache hit is diverted to a node the router thinks thin: that would move a live conversation off its state.
SMG_ROUTING = ("--policy", "cache_aware", "--routing-key-override", "--assignment-mode", "min_group", "--worker-warmup-divert-every", "0")
ROUTING_KEY_HEADER = b"x-smg-routing-key"
SESSION_HEADER = b"x-memt-session"
DRAIN_PATH = "/admin/drain"
UNDRAIN_PATH = "/admin/undrain"
READY_PATH = "/health/ready"
DRAIN_WAIT = 120.0  # seconds a drain waits for the requests and commits under way


class Node:
    """This proxy's part in the cluster: the requests it is serving, and whether it is draining."""

    def __init__(self, sessions):
        self.sessions = sessions
        self.draining = False
        self.in_flight = 0  # requests being served (not the health checks or the drain itself)

    async def drain(self, wait: float = DRAIN_WAIT) -> dict:
        """Stop taking requests, finish the ones under way and their commits, then hand every session off
        (``Placement.unload``: its core frees it and gives up its ownership, its memory stays in the store)."""
        self.draining = True
        sessions = self.sessions
        deadline = time.monotonic() + wait
        while self.in_flight or sessions.behind or any(state.lock.locked() for state in sessions.table):
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests or commits still under way after {wait:g} s")
            await asyncio.sleep(0.05)
        released = unloaded = 0
        for state in [*sessions.table, *sessions.table.evicted]:
            if state.exists:  # handed off: the core frees it and its ownership, its memory stays in the store
                unloaded += await sessions.placement.unload(state)
                continue
            lease = state.drop_lease()
            if lease is not None:
                await sessions.leases.release(state, lease)
                released += 1
        sessions.table.evicted.clear()
        log.info("drained: %d sessions, %d handed off, %d leases released", len(sessions.table), unloaded, released)
        return {"drained": True, "sessions": len(sessions.table), "handed_off": unloaded, "leases_released": released}


async def _answer(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]})
    await send({"type": "http.response.body", "body": payload})


def _error(status: int, message: str, code: str, param: str | None = None) -> dict:
    type_ = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ClusterMiddleware:
    """ASGI middleware: the routing key as the session, the drain route, readiness and refusals while draining."""

    def __init__(self, app, node: Node, authorize=None):
        self.app = app
        self.node = node
        self.authorize = authorize  # (headers) -> (status, error body) or None: the operator key guards the drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        node, path = self.node, scope.get("path", "")
        if path in (DRAIN_PATH, UNDRAIN_PATH) and scope["method"] == "POST":
            refusal = self.authorize(scope["headers"]) if self.authorize else None
            if refusal is not None:
                return await _answer(send, *refusal)
            if path == UNDRAIN_PATH:
                node.draining = False
                log.info("undrained: taking requests again")
                return await _answer(send, 200, {"draining": False})
            try:
                return await _answer(send, 200, await node.drain())
            except TimeoutError as exc:
                return await _answer(send, 503, _error(503, f"drain incomplete: {exc}", "drain_timeout"))
        if path == "/health" or path == READY_PATH:
            if node.draining and path == READY_PATH:
                return await _answer(send, 503, _error(503, "not ready: this node is draining", "draining"))
            return await self.app(scope, receive, send)
        if node.draining:
            return await _answer(send, 503, _error(503, "this node is draining; retry (the router sends the session to another node)", "draining"),
                                 [(b"retry-after", b"1")])
        headers = scope["headers"]
        key = next((value for name, value in headers if name == ROUTING_KEY_HEADER), None)
        if key is not None:
            session = next((value for name, value in headers if name == SESSION_HEADER), None)
            if session is None:
                scope = dict(scope, headers=[*headers, (SESSION_HEADER, key)])
            elif session != key:
                return await _answer(send, 400, _error(
                    400, "X-MemT-Session and X-SMG-Routing-Key name different sessions: the router routes by one, the proxy would serve the other",
                    "invalid_session", "X-SMG-Routing-Key"))
        node.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            node.in_flight -= 1


def install(app, sessions, *, api_keys: dict[str, str] | None = None, admin_keys: list[str] = ()) -> Node:
    """Make the proxy app a cluster node (see the module docstring); returns the node.

    A drain acts on every tenant, so it takes an operator key (``admin_keys``, ``--admin-key``), never a
    tenant's API key (403). A proxy with neither (no keys at all) lets anyone on its network drain it."""
    node = Node(sessions)

    def token(headers) -> str | None:
        return bearer_token(next((v for n, v in headers if n == b"authorization"), b"").decode("latin-1"))

    def authorize(headers) -> tuple[int, dict] | None:
        if not api_keys and not admin_keys:
            return None
        given = token(headers)
        if matching(given, admin_keys) is not None:
            return None
        if matching(given, api_keys or {}) is not None:
            return 403, _error(403, "draining (or undraining) a node needs the operator key (--admin-key); a tenant's API key may not", "forbidden")
        return 401, _error(401, "invalid API key; send 'Authorization: Bearer <operator key>'", "invalid_api_key")

    app.add_middleware(ClusterMiddleware, node=node, authorize=authorize)
    app.state.cluster_node = node
    return node
