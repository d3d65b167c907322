"""Which memory a chat request's turn runs on: a named session (``X-MemT-Session``: lock → create, adopt or fork →
lease, held by ``TurnRunner.hold_named``) or, without the header, the deepest kept state a conversation's transcript
reaches (``memt_proxy.session.branches``). Either way the turn is planned on that memory (``ChatPlanner.on_memory``)
and handed to the service's answer; a client's retry of an answered turn gets the kept answer.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, AsyncIterator, Awaitable, Callable

from memt_proxy.chat.plan import ChatPlanner, regenerates
from memt_proxy.chat.stream import replayed
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.session.branches import resume
from memt_proxy.session.sessions import HeldSession, Sessions
from memt_proxy.session.transcript import as_dict
from memt_proxy.session.turn import Turn, TurnRunner
from memt_proxy.worker import off_loop


class ChatMemory:
    """Holds a chat turn's memory and hands the turn to the service: ``run`` answers it as a body, ``streamed`` as
    chunks (both ``(turn, held, ...)``, as ``TurnRunner.answer`` calls them)."""

    def __init__(
        self, sessions: Sessions, runner: TurnRunner, plans: ChatPlanner, *,
        run: Callable[[Turn, HeldSession | None], Awaitable[dict]],
        streamed: Callable[[Turn, HeldSession | None, contextlib.AsyncExitStack | None], AsyncIterator[dict]],
    ):
        self.sessions = sessions
        self.runner = runner
        self.plans = plans
        self.run = run
        self.streamed = streamed

    async def named(
        self, request: ChatCompletionRequest, *, tenant: str, session: str, policy: str, strict: bool, size: int, digest: str, retry: bool, key: str | None,
    ) -> Any:
        """The turn on the named session ``session`` (``strict``: a request that does not continue its memory is refused,
        not forked); a client's retry of the session's last committed turn gets that turn's answer."""

        def plan(state, hashes=None):
            return off_loop(size, self.plans.on_memory, request, state, policy, hashes)

        held, hold, prepare = await self.runner.hold_named(
            tenant, session, request.messages, policy=policy, strict=strict, size=size, digest=digest, retry=retry, key=key,
            plan=plan, starts_over=functools.partial(regenerates, request),
        )
        if held is None:  # a client's retry of the session's last committed turn
            return replayed(request, prepare)
        return await self._answer(request, held, hold, prepare)

    async def headerless(self, request: ChatCompletionRequest, *, tenant: str, policy: str, size: int, digest: str, retry: bool, key: str | None) -> Any:
        """A conversation without X-MemT-Session, identified by its transcript (``memt_proxy.session.branches``): resumed
        from the deepest kept state its earlier messages reach; with none, a plain generation. Behind the answer
        the conversation's next state is forked (``TurnRunner.after``). A client's retry gets the kept answer."""
        kept = self.runner.retried(tenant, digest, retry, key)
        if kept is not None:
            return replayed(request, kept)
        plan, held, hold = await resume(self.sessions, request.messages, tenant, size)
        if held is None:
            turn = await off_loop(size, self.plans.stateless, request, tenant)
            turn.headerless, turn.digest, turn.key, turn.policy = plan, digest, key, policy
            conversation = [as_dict(m) for m in request.messages if m.role not in ("system", "developer")]
            earlier, opened = conversation[: len(plan.hashes)], conversation[len(plan.hashes):]
            turn.opening = functools.partial(off_loop, size, self.plans.opening_ids, earlier, opened, turn.thinking, turn.prefix)
            return self.streamed(turn, None, None) if turn.request.stream else await self.run(turn, None)

        async def prepare() -> Turn:
            turn = await off_loop(size, self.plans.on_memory, request, held.state, policy, plan.hashes)
            turn.headerless, turn.digest, turn.key = plan, digest, key
            return turn

        return await self._answer(request, held, hold, prepare)

    async def _answer(self, request: ChatCompletionRequest, held: HeldSession, hold: contextlib.AsyncExitStack, prepare: Callable[[], Awaitable[Turn]]) -> Any:
        """The turn ``prepare`` makes, answered on ``held`` (``TurnRunner.answer``: a body, or a stream)."""
        return await self.runner.answer(held, hold, prepare, stream=bool(request.stream), run=self.run, streamed=self.streamed, create=True)
