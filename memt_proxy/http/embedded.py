"""One-process deployment (``python -m memt_proxy --embedded``): the core runs inside the proxy's process.

The core is built exactly as ``python -m memt_core.launch`` builds it (``plan_launch`` → ``build_app``:
same validation, engine, protocol and routes), but is never bound to a port: ``InProcessNativeClient``
is the proxy's ``AsyncNativeClient`` with its transport swapped for calls in the same event loop: control
actions and plain (not streamed) generations call the core's ``MemTService`` as its routes do, the
bodies and answers passed as JSON would carry them and its errors turned into the status and body the
route would send, without the routing around it; streams (and any other request) go through the core's
ASGI app. No socket, no HTTP parsing, no second process; the requests, their bodies, their errors and the
protocol's guarantees are the same as over HTTP. A stream left early tells the core the client is gone
(``http.disconnect``), which cancels the query, as a dropped connection does.

``embed(proxy_app, core_app)`` makes the core's lifespan (engine start and stop) enclose the proxy's,
so the proxy finishes its pending commits before the engine stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shlex
from typing import Any, AsyncIterator


from memt_core.client.native import AsyncNativeClient, check_response, json_or_text, stream_chunk
from memt_core.request_body import OFF_LOOP_BYTES

log = logging.getLogger("memt.proxy")

_END = object()  # the app returned


def core_plan(model_path: str | None, core_args: str = ""):
    """The core's launch plan from ``--model-path`` and the launcher flags in ``core_args`` (one string)."""
    from memt_core.launch import build_parser, plan_launch

    argv = shlex.split(core_args) + (["--model-path", model_path] if model_path else [])
    args: argparse.Namespace = build_parser().parse_args(argv)
    return plan_launch(args)


def build_core(plan):
    """The core's ASGI app and its service (engine loaded, not yet started: the app's lifespan starts it)."""
    from memt_core.launch import build_app

    return build_app(plan)


def embed(proxy_app, core_app) -> None:
    """Run ``core_app``'s lifespan around ``proxy_app``'s: the engine starts first and stops last."""
    inner = proxy_app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with core_app.router.lifespan_context(core_app):
            async with inner(app):
                yield

    proxy_app.router.lifespan_context = lifespan


@contextlib.asynccontextmanager
async def asgi_exchange(app, method: str, path: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
    """Send one request to ``app`` in this event loop; yields the response status and its body as sent.

    Leaving before the body ended tells the app the client disconnected.
    """
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.put_nowait(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        except Exception:
            log.exception("the embedded core failed on %s %s", method, path)
        finally:
            sent.put_nowait(_END)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"embedded"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 0), "server": ("embedded", 0),
    }
    task = asyncio.get_running_loop().create_task(run())
    ended = False

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal ended
        while not ended:
            message = await sent.get()
            if message is _END:
                ended = True
                return
            if message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                ended = not message.get("more_body", False)

    try:
        start = await sent.get()
        if start is _END:
            raise ConnectionResetError(f"the embedded core answered nothing to {method} {path}")
        yield start["status"], chunks()
    finally:
        gone.set()  # after a complete response this changes nothing; mid-stream it is the client leaving
        if task.done():
            task.result()


class InProcessNativeClient(AsyncNativeClient):
    """``AsyncNativeClient`` whose requests go straight to the core in this process: to its ``service`` where
    given (control actions, plain generations; see the module docstring), else through its ASGI ``app``.

    ``max_body_bytes``: the core's ``--max-request-bytes``; a larger body goes through the app, which refuses it
    (as does one the app would parse off the event loop).
    A core that keeps to the spec's wire format (``--spec-strict``) is called through the app only.
    """

    def __init__(self, app, *, service=None, max_body_bytes: int | None = None, api_key: str | None = None, timeout: float = 300):
        super().__init__("http://embedded", api_key=api_key, timeout=timeout)
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._routes = {"/memt/control": service.control, "/generate": service.generate} if service is not None else {}

    async def aclose(self) -> None:
        """Nothing to close: there are no connections."""

    async def _send(self, stage: str, method: str, path: str, *, body: dict | None = None, changes_state: bool) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        call = self._routes.get(path) if method == "POST" and body is not None and not body.get("stream") else None
        if call is not None and len(data) <= min(OFF_LOOP_BYTES, self.max_body_bytes or OFF_LOOP_BYTES):
            return await self._call(call, stage, data, changes_state)
        try:
            async with asgi_exchange(self.app, method, path, data, self.headers) as (status, chunks):
                text = b"".join([chunk async for chunk in chunks]).decode("utf-8")
        except ConnectionResetError as exc:
            raise self._broken(stage, exc, changes_state) from exc
        return check_response(status, json_or_text(text), stage, changes_state=changes_state)

    async def _call(self, call, stage: str, data: bytes, changes_state: bool) -> Any:
        """What the core's route answers to ``data``, from calling the service it wraps. The call is a task of its
        own that runs to its end even if this request is cancelled, as a route does when its client leaves."""
        from memt_core.server.app import route_answer  # the core's own answer (imported with the core)

        status, answer = await asyncio.shield(asyncio.ensure_future(route_answer(call, data, stage)))
        return check_response(status, answer, stage, changes_state=changes_state)

    async def _stream(self, body: dict, stage: str) -> AsyncIterator[dict]:
        data = json.dumps(body).encode()
        try:
            async with asgi_exchange(self.app, "POST", "/generate", data, self.headers) as (status, chunks):
                if status >= 400:
                    text = b"".join([chunk async for chunk in chunks]).decode("utf-8")
                    check_response(status, json_or_text(text), stage)
                pending = b""
                async for data in chunks:
                    *lines, pending = (pending + data).split(b"\n")
                    for line in lines:
                        chunk = stream_chunk(line.decode("utf-8").rstrip("\r"), stage)
                        if chunk is None:
                            continue
                        if "__done__" in chunk:
                            return
                        yield chunk
        except ConnectionResetError as exc:
            raise self._broken(stage, exc, False) from exc
