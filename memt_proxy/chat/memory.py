"""Which memory a chat request's turn runs on: a named session (``X-MemT-Session``: lock → create, adopt or fork →
lease, held by ``TurnRunner.hold_named``) or, without the header, the deepest kept state a conversation's transcript
reaches (held by ``TurnRunner.hold_headerless``, as for the Responses surface). Either way the turn is planned on that
memory (``ChatPlanner.on_memory``); a client's retry of an answered turn gets the kept answer. ``ChatMemory`` calls
nothing of the service back: it returns where the turn is answered (``OnMemory``), and the service answers it.
"""

from __future__ import annotations

import dataclasses
import functools

from memt_proxy.chat.plan import ChatPlanner, regenerates
from memt_proxy.protocol import ChatCompletionRequest
from memt_proxy.request_context import RequestContext
from memt_proxy.session.sessions import Sessions
from memt_proxy.session.transcript import as_dict
from memt_proxy.session.turn import MemoryPlan, OnMemory, Turn, TurnRunner
from memt_proxy.worker import off_loop

__all__ = ["ChatMemory", "OnMemory"]


class ChatMemory:
    """Holds a chat turn's memory and says where the turn is answered (``OnMemory``): the service answers it."""

    def __init__(self, sessions: Sessions, runner: TurnRunner, plans: ChatPlanner):
        self.sessions = sessions
        self.runner = runner
        self.plans = plans

    async def named(self, request: ChatCompletionRequest, context: RequestContext, *, session: str, strict: bool) -> OnMemory:
        """The turn on the named session ``session`` (``strict``: a request that does not continue its memory is refused,
        not forked); a client's retry of the session's last committed turn gets that turn's answer."""

        def plan(memory: MemoryPlan, hashes=None):
            return off_loop(context.size, self.on_memory, request, context, memory, hashes)

        return await self.runner.hold_named(
            context, session, request.messages, strict=strict, plan=plan, starts_over=functools.partial(regenerates, request),
        )

    async def headerless(self, request: ChatCompletionRequest, context: RequestContext) -> OnMemory:
        """A conversation without X-MemT-Session, identified by its transcript (``memt_proxy.session.headerless``): resumed
        from the deepest kept state its earlier messages reach; with none, a plain generation. Behind the answer
        the conversation's next state is forked (``TurnRunner.after``). A client's retry gets the kept answer."""
        kept = self.runner.retried(context.tenant, context.digest, context.retry, context.key)
        if kept is not None:
            return OnMemory(replay=kept)

        def plain(memory: MemoryPlan) -> Turn:
            prompt = self.plans.stateless(request)
            conversation = [as_dict(m) for m in request.messages if m.role not in ("system", "developer")]
            hashes = memory.headerless.hashes
            earlier, opened = conversation[: len(hashes)], conversation[len(hashes):]
            opening = functools.partial(off_loop, context.size, self.plans.opening_ids, earlier, opened, prompt.thinking, prompt.prefix)
            return Turn(prompt, dataclasses.replace(memory, opening=opening), context)

        return await self.runner.hold_headerless(
            context, request.messages, plain=lambda memory: off_loop(context.size, plain, memory),
            plan=lambda memory, found: off_loop(context.size, self.on_memory, request, context, memory, found.hashes),
        )

    def on_memory(self, request: ChatCompletionRequest, context: RequestContext, memory: MemoryPlan, hashes: list[str] | None = None) -> Turn:
        """The turn on the memory a hold planned (``ChatPlanner.on_memory``: the part of the transcript it lacks)."""
        return Turn(self.plans.on_memory(request, memory.state, hashes), memory, context)
