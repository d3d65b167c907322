"""The upstream MemT server: its identity and limits checked, native failures mapped to ``ProxyError`` once,
plain generations (no session)."""

from __future__ import annotations

import logging
from typing import AsyncIterator

from memt_core.client.chat_format import serves
from memt_core.client.errors import MemTClientError
from memt_core.client.native import AsyncNativeClient
from memt_core.errors import EpochMismatch
from memt_proxy.errors import ProxyError, Unavailable, from_native
from memt_proxy.session.state import SessionTable

log = logging.getLogger("memt.proxy")


class Upstream:
    """Calls to one upstream, failures mapped where they enter, and the limits it reports. Where a failure shows that
    the upstream restarted, every session of ``table`` is forgotten (its native session is gone: ``restarted``)."""

    def __init__(self, client: AsyncNativeClient, *, identity: str | None, served: dict | None, table: SessionTable):
        self.client = client
        self.identity = identity  # the model/tokenizer identity the upstream must serve
        self.served = served  # what its /memt/identity must say (model, config_sha256) when it reports no identity hash
        self.table = table
        self.checked = False
        self.max_prefill_tokens: int | None = None
        self.chunk_tokens: int | None = None
        self.context_length: int | None = None  # prompt + output tokens the upstream allows, where it says so
        self.capacity: int | None = None  # the upstream's session capacity, where it says so
        self.epoch: str | None = None  # the upstream's epoch when it last answered ``check``

    async def check(self, *, refresh: bool = False) -> None:
        """The upstream must serve the checkpoint this proxy encodes prompts for; learn its limits.
        ``refresh``: ask it again even if it answered before (readiness)."""
        if self.checked and not refresh:
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
        self.capacity = capabilities.get("max_sessions_per_rank")  # our core's extension; None elsewhere
        epoch, self.epoch = self.epoch, capabilities.get("epoch")
        if epoch is not None and self.epoch != epoch:
            # a new epoch (learned here, e.g. by a readiness probe, before any request failed for it): every session
            # is gone upstream, and nothing may be trimmed on the belief that memory holds it
            log.warning("the upstream restarted (a new epoch): every session starts over from its next request's transcript")
            self.restarted()
        self.checked = True

    async def call(self, call, *args, **kwargs):
        """``await call(*args, **kwargs)`` on the native client, its failure mapped to ProxyError."""
        try:
            return await call(*args, **kwargs)
        except MemTClientError as exc:
            raise self.error(exc) from None

    async def stream(self, upstream: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """A native stream's bodies, its failure mapped to ProxyError; leaving early closes it (cancels upstream)."""
        try:
            async for body in upstream:
                yield body
        except MemTClientError as exc:
            raise self.error(exc) from None
        finally:
            await upstream.aclose()

    def restarted(self) -> None:
        """The upstream restarted: every native session is gone."""
        for state in self.table:
            state.forget()

    def error(self, exc: MemTClientError) -> ProxyError:
        """The ProxyError for a native failure; an epoch mismatch means the upstream restarted."""
        if isinstance(exc.cause, EpochMismatch):
            self.checked = False  # the upstream restarted: sessions are gone; relearn its epoch
            self.restarted()
        return from_native(exc)

    def pieces(self, ids: list[int]) -> list[list[int]]:
        """``ids`` as commits of at most the upstream's max_prefill_tokens (usually one).

        A prompt that fits can make, with its answer, a turn that does not: rather than lose the answer,
        it goes in several commits of the same transaction, cut at whole ``chunk_tokens`` so the write
        events fall where one commit would put them (each later piece reads the memory as written so far).
        """
        limit = self.max_prefill_tokens
        if not limit or len(ids) <= limit:
            return [ids]
        chunk = self.chunk_tokens or 1
        step = max(chunk, limit - limit % chunk)
        return [ids[i: i + step] for i in range(0, len(ids), step)]

    def generate(self, prompt: list[int], sampling: dict):
        """An ordinary generation without memory (no session)."""
        return self.call(self.client.generate, prompt, sampling_params=sampling)

    def generate_stream(self, prompt: list[int], sampling: dict) -> AsyncIterator[dict]:
        return self.stream(self.client.generate_stream(prompt, sampling_params=sampling))
