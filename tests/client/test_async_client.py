"""``AsyncNativeClient`` (aiohttp) at the transport's edges: which failures are certain and which
uncertain, SSE lines longer than aiohttp's own line limit, and a stream left early.

The failures need a server that misbehaves on cue, so these run against small aiohttp.web apps on
127.0.0.1 (real sockets, the client unchanged); the client's normal traffic against the real memt_core
server is covered by the proxy's end-to-end tests, which use it for every upstream call.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from e2e.servers import free_port
from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient
from memt_core.errors import LeaseConflict

EPOCH = "epoch-1"


async def capabilities(request: web.Request) -> web.Response:
    return web.json_response({"epoch": EPOCH, "protocol": "memt-http-v1"})


async def serving(routes: list[tuple[str, str, object]], scenario) -> object:
    """Run ``scenario(client)`` against an app with the capabilities route and ``routes``."""
    app = web.Application()
    app.router.add_get("/memt/capabilities", capabilities)
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    client = AsyncNativeClient(f"http://127.0.0.1:{port}", timeout=10)
    try:
        return await scenario(client)
    finally:
        await client.aclose()
        await runner.cleanup()


async def drop_after_reading(request: web.Request) -> web.Response:
    """Reads the whole request, then closes the connection without answering."""
    await request.read()
    request.transport.close()
    await asyncio.sleep(1)
    raise ConnectionResetError


def test_connection_refused_is_certain_and_503():
    async def scenario():
        client = AsyncNativeClient(f"http://127.0.0.1:{free_port()}", timeout=5)
        try:
            await client.capabilities()
        finally:
            await client.aclose()

    with pytest.raises(MemTClientError) as info:
        asyncio.run(scenario())
    assert info.value.uncertain is False and info.value.status == 503
    assert "cannot connect" in str(info.value) and info.value.stage == "capabilities"


def test_a_write_whose_connection_drops_after_sending_is_uncertain():
    async def scenario(client):
        outcomes = {}
        for name, call in {
            "commit": lambda: client.commit("s", "lease", "t1", [1, 2, 3]),
            "publish": lambda: client.control("publish", "s", lease="lease", transaction="t1"),
            "query": lambda: client.query("s", "lease", [1, 2]),
            "inspect": lambda: client.control("inspect", "s"),
        }.items():
            try:
                await call()
            except MemTClientError as exc:
                outcomes[name] = exc
        return outcomes

    outcomes = asyncio.run(serving([("POST", "/generate", drop_after_reading), ("POST", "/memt/control", drop_after_reading)], scenario))
    assert set(outcomes) == {"commit", "publish", "query", "inspect"}  # every one failed
    for name in ("commit", "publish"):  # state-changing: the server may have applied it
        assert outcomes[name].uncertain is True and "uncertain" in str(outcomes[name]), name
    for name in ("query", "inspect"):  # changes nothing: safe to retry
        assert outcomes[name].uncertain is False and "retry" in str(outcomes[name]), name
    assert all(exc.status == 503 for exc in outcomes.values())


def test_server_errors_keep_their_status_and_typed_cause():
    async def conflict(request: web.Request) -> web.Response:
        return web.json_response(LeaseConflict("lease held by another client").to_wire(), status=409)

    async def scenario(client):
        with pytest.raises(MemTClientError) as info:
            await client.control("acquire", "s")
        return info.value

    error = asyncio.run(serving([("POST", "/memt/control", conflict)], scenario))
    assert error.status == 409 and error.uncertain is False and "lease held by another client" in str(error)
    assert isinstance(error.cause, LeaseConflict)


def test_stream_lines_longer_than_aiohttp_line_limit_arrive_whole():
    text = "x" * 300_000  # cumulative stream bodies grow with the output; aiohttp's readline stops near 128 KiB
    bodies = [{"text": text[:10], "output_ids": [1]}, {"text": text, "output_ids": list(range(20_000))}]

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for body in bodies:
            data = f"data: {json.dumps(body)}\r\n\r\n".encode()
            for start in range(0, len(data), 7_000):  # in many small writes
                await response.write(data[start: start + 7_000])
        await response.write(b"data: [DONE]\n\n")
        return response

    async def scenario(client):
        return [chunk async for chunk in client.generate_stream([1, 2], sampling_params={"max_new_tokens": 4})]

    assert asyncio.run(serving([("POST", "/generate", stream)], scenario)) == bodies


def test_leaving_a_stream_early_closes_its_connection():
    """The proxy cancels an upstream query by dropping the stream: the server must see the connection go."""
    seen = {}

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"text": "a", "output_ids": [1]}\n\n')
        try:
            for _ in range(200):  # ~10 s of a generation that would go on
                await asyncio.sleep(0.05)
                await response.write(b'data: {"text": "ab", "output_ids": [1, 2]}\n\n')
            seen["finished"] = True
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            seen["dropped"] = True
            raise
        return response

    async def scenario(client):
        async with asyncio.timeout(5):
            chunks = client.query_stream("s", "lease", [1])
            first = await anext(chunks)
            await chunks.aclose()
            while "dropped" not in seen:
                await asyncio.sleep(0.02)
        return first

    assert asyncio.run(serving([("POST", "/generate", stream)], scenario)) == {"text": "a", "output_ids": [1]}
    assert seen == {"dropped": True}


def test_streams_that_end_leave_their_connection_for_the_next_request():
    """A stream read to its [DONE] hands its connection back (the next request reuses it); one left early does not."""
    peers = []

    async def stream(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"text": "a", "output_ids": [1]}\n\n')
        if len(peers) == 4:  # the stream the client leaves: still generating when it does
            await asyncio.sleep(0.5)
        await response.write(b'data: {"text": "ab", "output_ids": [1, 2]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    async def scenario(client):
        for _ in range(3):
            assert [c["text"] async for c in client.generate_stream([1])] == ["a", "ab"]
        chunks = client.generate_stream([1])
        assert (await anext(chunks))["text"] == "a"
        await chunks.aclose()  # left early: that connection is dropped
        assert [c["text"] async for c in client.generate_stream([1])] == ["a", "ab"]

    asyncio.run(serving([("POST", "/generate", stream)], scenario))
    assert peers[0] == peers[1] == peers[2] == peers[3]  # one connection for the streams read to the end
    assert peers[4] != peers[3]  # the one after a stream left early needed a new connection
