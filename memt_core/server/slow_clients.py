"""An HTTP/1.1 protocol for uvicorn that closes a connection whose request headers do not arrive in time.

uvicorn times out idle keep-alive connections but not a request that has begun: a client that sends
half a header line and stalls holds its connection (and a slot of the server) forever. This protocol
arms a timer at the first byte of each request (a new connection, or new data on an idle keep-alive
one) and disarms it once the request's headers are complete; if it fires first, the connection is
closed. The deadline counts from the first byte, so a client trickling a byte at a time cannot extend
it. Bodies have their own deadline in the app (``--body-timeout``, 408).
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("memt.server")

DEFAULT_HEADER_TIMEOUT = 10.0


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing connections whose request headers take longer than ``seconds``."""

    class HeaderTimeoutProtocol(H11Protocol):
        header_timeout = seconds

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._header_timer: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._awaiting_headers():
                self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _awaiting_headers(self) -> bool:
            """No request is under way: the bytes received (if any) are the start of the next one's headers."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _timed_out(self) -> None:
            self._header_timer = None
            if self._awaiting_headers() and not self.transport.is_closing():
                log.info("closing a connection whose request headers did not arrive within %g s", self.header_timeout)
                self.transport.close()

    return HeaderTimeoutProtocol
