"""The upstream MemT server: its identity and limits checked, native failures mapped to ``ProxyError`` once,
plain generations (no session)."""

from __future__ import annotations

import logging
from typing import AsyncIterator

from memt_core.client.chat_format import serves
from memt_core.client.errors import MemTClientError
from memt_core.errors import EpochMismatch
from memt_proxy.errors import ProxyError, Unavailable, from_native

log = logging.getLogger("memt.proxy")


class Upstream:
    """Calls to the upstream, failures mapped where they enter. A part of ``memt_proxy.session.sessions.Sessions``."""

    async def check_upstream(self, *, refresh: bool = False) -> None:
        """The upstream must serve the checkpoint this proxy encodes prompts for; learn its limits.
        ``refresh``: ask it again even if it answered before (readiness)."""
        if self._upstream_checked and not refresh:
            return
        try:
            capabilities = await self.client.capabilities(refresh=True)
        except MemTClientError as exc:
            raise from_native(exc) from None
        described = None
        if "identity" not in capabilities:  # a server that reports only the spec's fields: its /memt/identity
            try:
                described = await self.client.identity()
            except MemTClientError as exc:
                raise from_native(exc) from None
        if not serves(self.identity, self.served, capabilities, described):
            raise Unavailable("the upstream MemT server serves a different model/tokenizer than this proxy's --model-path", code="upstream_identity_mismatch")
        self.max_prefill_tokens = capabilities.get("max_prefill_tokens")
        self.chunk_tokens = capabilities.get("chunk_tokens")
        self.context_length = capabilities.get("context_length")  # our core's extension; None elsewhere
        self.upstream_sessions = capabilities.get("max_sessions_per_rank")  # our core's extension; None elsewhere
        self._upstream_checked = True
        await self.adopt_branches()

    async def call(self, call, *args, **kwargs):
        """``await call(*args, **kwargs)`` on the native client, its failure mapped to ProxyError."""
        try:
            return await call(*args, **kwargs)
        except MemTClientError as exc:
            raise self.upstream_error(exc) from None

    async def stream(self, upstream: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """A native stream's bodies, its failure mapped to ProxyError; leaving early closes it (cancels upstream)."""
        try:
            async for body in upstream:
                yield body
        except MemTClientError as exc:
            raise self.upstream_error(exc) from None
        finally:
            await upstream.aclose()

    def upstream_error(self, exc: MemTClientError) -> ProxyError:
        """The ProxyError for a native failure; an epoch mismatch means the upstream restarted."""
        if isinstance(exc.cause, EpochMismatch):
            self._upstream_checked = False  # the upstream restarted: sessions are gone; relearn its epoch
            for state in self.table:
                state.forget()
        return from_native(exc)

    def generate(self, prompt: list[int], sampling: dict):
        """An ordinary generation without memory (no session)."""
        return self.call(self.client.generate, prompt, sampling_params=sampling)

    def generate_stream(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        return self.stream(self.client.generate_stream(prompt, sampling_params=sampling))

