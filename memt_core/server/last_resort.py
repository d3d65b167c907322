"""The last-resort handler of both servers: an exception no handler took is answered in the server's error shape.

Starlette answers such an exception with a plain-text ``500 Internal Server Error``, re-raises it, and uvicorn then
logs its trace a second time and closes the connection, so a keep-alive client's next request on it is lost. This
ASGI middleware, placed inside the app's request counting, catches it instead: the trace is logged once, the client
gets a 500 whose body is the server's error shape (``body(exc)``: the core's native one, the proxy's OpenAI one,
naming no internals), and the connection stays open. An exception after the response has started (a stream) cannot
be answered any more: it is logged once and the response ends there.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

__all__ = ["LastResort"]


class LastResort:
    """``app.add_middleware(LastResort, body=…, log=…)``; ``body(exc)`` is the JSON error body of the 500."""

    def __init__(self, app, *, body: Callable[[BaseException], dict], log: logging.Logger):
        self.app = app
        self.body = body
        self.log = log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:  # noqa: BLE001 — the last resort: every exception no handler took
            self.log.error("unhandled error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
            if started:
                return  # mid-response: nothing more can be said; the server ends the connection
            data = json.dumps(self.body(exc)).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
