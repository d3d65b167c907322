"""The session layer's one source of time: monotonic seconds, and waiting on them.

``Leases`` (its waits for another client's lease, its renewals, the idle release) and the idle time ``Sessions`` marks
on a state read it; nothing else of the layer needs a clock. The proxy runs on ``Clock`` (the event loop's wall
clock); a test passes one whose time moves only when it says (``tests/proxy/session/session_harness.py``), so no
session test waits for a second to pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class Clock:
    """Monotonic seconds (``time.monotonic``) and the event loop's waiting."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, until: float) -> None:
        """Until ``event`` is set or ``now()`` reaches ``until``, whichever comes first."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, until - self.now()))
