"""Which memory a chat request's turn runs on: a named session (``X-MemT-Session``: lock → create, adopt or fork →
lease, held by ``TurnRunner.hold_named``) or, without the header, the deepest kept state a conversation's transcript
reaches (held by ``TurnRunner.hold_headerless``, as for the Responses surface). Either way the turn is planned on that
memory (``ChatPlanner.on_memory``); a client's retry of an answered turn gets the kept answer. ``ChatMemory`` calls
nothing of the service back: it returns where the turn is answered (``OnMemory``), and the service answers it.
"""

from __future__ import annotations

import functools

from memt_proxy.chat.plan import ChatPlanner, regenerates
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.session.sessions import Sessions
from memt_proxy.session.transcript import as_dict
from memt_proxy.session.turn import OnMemory, TurnRunner
from memt_proxy.worker import off_loop

__all__ = ["ChatMemory", "OnMemory"]


class ChatMemory:
    """Holds a chat turn's memory and says where the turn is answered (``OnMemory``): the service answers it."""

    def __init__(self, sessions: Sessions, runner: TurnRunner, plans: ChatPlanner):
        self.sessions = sessions
        self.runner = runner
        self.plans = plans

    async def named(
        self, request: ChatCompletionRequest, *, tenant: str, session: str, policy: str, strict: bool, size: int, digest: str, retry: bool, key: str | None,
    ) -> OnMemory:
        """The turn on the named session ``session`` (``strict``: a request that does not continue its memory is refused,
        not forked); a client's retry of the session's last committed turn gets that turn's answer."""

        def plan(state, hashes=None):
            return off_loop(size, self.plans.on_memory, request, state, policy, hashes)

        held, hold, prepare = await self.runner.hold_named(
            tenant, session, request.messages, policy=policy, strict=strict, size=size, digest=digest, retry=retry, key=key,
            plan=plan, starts_over=functools.partial(regenerates, request),
        )
        if held is None:  # a client's retry of the session's last committed turn
            return OnMemory(replay=prepare)
        return OnMemory(held, hold, prepare)

    async def headerless(self, request: ChatCompletionRequest, *, tenant: str, policy: str, size: int, digest: str, retry: bool, key: str | None) -> OnMemory:
        """A conversation without X-MemT-Session, identified by its transcript (``memt_proxy.session.headerless``): resumed
        from the deepest kept state its earlier messages reach; with none, a plain generation. Behind the answer
        the conversation's next state is forked (``TurnRunner.after``). A client's retry gets the kept answer."""
        kept = self.runner.retried(tenant, digest, retry, key)
        if kept is not None:
            return OnMemory(replay=kept)

        def plain(found):
            turn = self.plans.stateless(request, tenant)
            conversation = [as_dict(m) for m in request.messages if m.role not in ("system", "developer")]
            earlier, opened = conversation[: len(found.hashes)], conversation[len(found.hashes):]
            turn.opening = functools.partial(off_loop, size, self.plans.opening_ids, earlier, opened, turn.thinking, turn.prefix)
            return turn

        return await self.runner.hold_headerless(
            tenant, request.messages, policy=policy, size=size, digest=digest, key=key,
            plain=lambda found: off_loop(size, plain, found),
            plan=lambda state, found: off_loop(size, self.plans.on_memory, request, state, policy, found.hashes),
        )
