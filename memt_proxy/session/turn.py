"""One turn on the session layer, whatever the surface: hold → answer or stream → memory after it → retry → usage.

A turn is three frozen parts, each built once: the ``Prompt`` a surface planned (what the model reads and how it
samples), the ``MemoryPlan`` the hold decided (which memory the prompt reads, what a completed answer does to it, where
the answer is kept for a retry) and the request's ``RequestContext``. A surface holds memory through the runner
(``hold_named``, ``hold_headerless``: where the turn is answered, an ``OnMemory``) and answers there through the runner's
one entry, ``run(on, answerer)``: the surface's ``Answerer`` generates and shapes the answer, the runner holds and lets
go. What the runner does, once for both surfaces:

* **hold**: a held session is let go when its answer ends; a stream's when the stream ends, or after
  ``STREAM_START_TIMEOUT`` if the client never starts reading it (``answer``, ``handed``, ``streaming``; whether a
  stream began is a turn's one mutable fact, a ``StreamStart`` apart from its frozen parts);
* **generate**: a query reading the held session's memory, or a plain generation (``generate``, ``generate_stream``);
* **memory after the answer** (``after``): function calls leave the turn pending (its exact tokens), a completed
  answer on memory policy ``auto`` is committed behind the answer (a named chat session keeping the state before it,
  ``keep_parent``; a session that forked follows the state it read, ``follower``), any other ends the turn as
  context; a header-less turn forks the conversation's next state instead (``memt_proxy.session.headerless``), a cut answer
  included (closed with the end token, as the app's transcript closes it);
* **retry**: an answer on memory is kept for a client's retry where its memory plan says (``MemoryPlan.retries``: a
  named session's record, the runner's ``answers``, or a store the surface made, e.g. a Responses thread's record beside
  the runner's); the rule is ``retries.retried``;
* **usage**: ``on_usage`` once per finished answer (``usage``), with the prompt tokens memory spared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

from memt_core.client.chat_format import ChatFormat
from memt_proxy.request_context import RequestContext
from memt_proxy.session.headerless import HeaderlessPlan, after_answer, closed, planned, resumable, resume
from memt_proxy.errors import ProxyError, Unavailable
from memt_proxy.session.sessions import HeldSession, MemoryFound, PendingTurn, Sessions, SessionState
from memt_proxy.session.transcript import message_hash, overlap
from memt_proxy.session.retries import IN_SESSION_RECORD, KeptAnswers, RetryStore, retried

log = logging.getLogger("memt.proxy")

STREAM_START_TIMEOUT = 60.0  # seconds a held session waits for its stream to be consumed


def no_usage(**usage) -> None:
    """The default ``on_usage``: nobody is counting."""


@dataclass(frozen=True)
class Prompt:
    """What the model reads and how it samples, as a surface planned it."""

    ids: list[int]  # the whole prompt
    turn_ids: list[int] = field(default_factory=list)  # the open turn's ids, the forced start included
    context_ids: list[int] = field(default_factory=list)  # the messages before the turn that memory lacks
    context: list[dict] = field(default_factory=list)
    turn: list[dict] = field(default_factory=list)  # the open turn's messages
    context_hashes: list[str] | None = None  # ``context``'s hashes, where the surface has them already
    thinking: bool = False
    sampling: dict = field(default_factory=dict)
    prefix: str = ""  # the forced start of the answer (a tool call)
    stops: list[str] = field(default_factory=list)
    parallel_tools: bool = True
    raw: bool = False  # the answer is structured JSON, returned as it is (no markup to parse)


@dataclass(frozen=True)
class MemoryPlan:
    """Which memory the prompt reads, what a completed answer does to it and where it is kept for a retry, as the hold
    decided."""

    policy: str = "off"  # memory: "auto" reads and commits, "read" only reads, "off" neither
    state: SessionState | None = None  # the memory the prompt reads (None: none)
    saved: int = 0  # prompt tokens memory spared (``MemoryTokens``)
    headerless: HeaderlessPlan | None = None  # a conversation identified by its transcript (``memt_proxy.session.headerless``)
    opening: Callable[[], Awaitable[list[int]]] | None = None  # header-less, no kept state: its history and turn as committed
    follower: HeldSession | None = None  # a named session that follows the state the prompt reads (a fork)
    keep_parent: bool = False  # a commit first keeps the state before it (named chat sessions)
    retries: RetryStore | None = None  # where the answer is kept for a client's retry (None: nowhere)


NO_MEMORY = MemoryPlan()


@dataclass(frozen=True)
class Turn:
    """Everything decided before the model runs, by either surface: its prompt, its memory and its request's context."""

    prompt: Prompt
    memory: MemoryPlan
    context: RequestContext


@dataclass
class StreamStart:
    """A stream's one mutable fact, kept apart from its frozen turn: whether it began (or was given up unstarted)."""
    begun: bool = False


class Answerer(Protocol):
    """A surface's side of ``TurnRunner.run`` for one request: its turn (a ``Turn``, or the surface's wrapper of one)
    answered on ``held`` (None: a plain generation) as a body or as events, a kept answer replayed for a retry."""

    def answer(self, turn: Any, held: HeldSession | None) -> Awaitable[Any]: ...

    def events(self, turn: Any, held: HeldSession | None) -> AsyncIterator[Any]: ...

    def replayed(self, kept: Any) -> Any: ...


@dataclass(frozen=True)
class OnMemory:
    """Where a turn is answered, as a hold says for either surface: on ``held`` (let go by closing ``hold``) with the turn
    ``prepare()`` makes there before the session starts; or the ``turn`` made already, on a started ``held`` or holding
    no memory (``hold``: what its answer lets go, if anything); or, for a client's retry, only the kept answer
    (``replay``)."""

    held: HeldSession | None = None
    hold: contextlib.AsyncExitStack | None = None
    prepare: Callable[[], Awaitable[Any]] | None = None
    turn: Any = None
    replay: Any = None


class TurnRunner:
    """Runs planned turns on one upstream's session layer for every surface (see the module docstring).
    ``on_usage(prompt_tokens=, completion_tokens=, saved_tokens=, memory=)``: once per finished answer (not for a
    replayed one); ``memory``: memory was read."""

    def __init__(self, sessions: Sessions, chat_format: ChatFormat):
        self.sessions = sessions
        self.chat_format = chat_format
        self.memory_tokens = sessions.memory_tokens
        self.answers = KeptAnswers()  # for a client's retry where no session keeps the answer
        self.on_usage = no_usage

    def memory_plan(self, policy: str, state: SessionState | None = None, **plan) -> MemoryPlan:
        """The memory plan of a turn reading ``state``, with the prompt tokens its memory spares."""
        return MemoryPlan(policy, state, self.memory_tokens.held(state), **plan)

    # ---- hold

    async def hold_named(self, context: RequestContext, session: str, messages: list, *, strict: bool,
                         plan: Callable[..., Awaitable[Any]], starts_over: Callable[[SessionState], bool]) -> OnMemory:
        """Hold a named session for a request carrying ``messages`` (its whole transcript): the session held, the stack
        that lets it go and the maker of its turn (``plan(memory, hashes=None)``: the turn on ``memory.state``); or, for a
        client's retry of the session's last committed turn, only its kept answer (the session let go).

        A request that does not continue the session's memory — a regenerate, an edit, another conversation sent under
        the same name (an app's background task) — is answered from the deepest kept state its earlier messages reach
        (the session keeps the state before each of its turns, ``keep_parent``), and the session then follows it (a copy
        of that state with the turn written in, ``Later.source``). With none, memory starts over from the request's
        history (``starts_over``: one that must), what it held kept first as a state of its own, so the conversation it
        was can still be resumed. ``strict``: the session refuses a diverging request instead (409). A named session's
        answers are kept for a retry in its record (``retries.InSessionRecord``)."""
        hold = contextlib.AsyncExitStack()
        held = await hold.enter_async_context(self.sessions.turn(context.tenant, session))
        state = held.state
        try:
            await self.sessions.placement.adopt_recorded(state)  # e.g. after a restart: its record, its last answer
            last = state.last_turn
            if last and last.get("version") == state.version and last.get("digest") == context.digest and retried(context.retry, context.key, last.get("key")):
                await hold.aclose()
                return OnMemory(replay=last)
            forked = None if strict or context.policy != "auto" else await self._fork(held, hold, messages, context, plan)
        except BaseException:
            await hold.aclose()
            raise
        if forked is not None:
            return forked

        async def prepare():
            return await self._on_named(state, context.policy, strict, plan, starts_over)

        return OnMemory(held, hold, prepare)

    async def hold_headerless(self, context: RequestContext, messages: list, *, plain: Callable[[MemoryPlan], Awaitable[Any]],
                              plan: Callable[[MemoryPlan, HeaderlessPlan], Awaitable[Any]]) -> OnMemory:
        """Hold the memory of a conversation without a session name, for either surface: the deepest kept state its
        ``messages`` reach (``headerless.resume``), with the maker of its turn there (``plan(memory, found)``); reaching
        none, the plain generation's turn (``plain(memory)``). Either memory plan is the header-less plan's
        (``MemoryPlan.headerless``: its answer forks the conversation's next state, ``after``), its answer kept for a
        retry in ``answers``."""
        found, held, hold = await resume(self.sessions, messages, context.tenant, context.size)
        if held is None:
            return OnMemory(turn=await plain(MemoryPlan(context.policy, headerless=found, retries=self.answers)))

        async def prepare():
            return await plan(self.memory_plan(context.policy, held.state, headerless=found, retries=self.answers), found)

        return OnMemory(held, hold, prepare)

    async def _fork(self, held: HeldSession, hold: contextlib.AsyncExitStack, messages: list, context: RequestContext, plan) -> OnMemory | None:
        """Where a named session's diverging request is answered: on the kept state it forks from, held (let go with the
        session), the session following it (``MemoryPlan.follower``); None: no fork (the request continues memory, or no
        kept state holds a prefix of it)."""
        state = held.state
        if not state.committed or not state.history_known:
            return None
        found = await planned(self.sessions, messages, state.tenant, context.size)
        if found.found is None or overlap(found.hashes, state.committed):
            return None
        origin_hold = contextlib.AsyncExitStack()
        try:
            origin = await origin_hold.enter_async_context(self.sessions.turn(state.tenant, found.found.name))
            if not await resumable(self.sessions, origin.state, found):
                await origin_hold.aclose()  # closed meanwhile: memory starts over instead
                return None
        except ProxyError as exc:
            await origin_hold.aclose()
            if exc.status != 429:
                raise
            return None
        except BaseException:
            await origin_hold.aclose()
            raise
        hold.push_async_callback(origin_hold.aclose)  # let go with the session, before it (its commit forks from it)
        log.info("%s forks from a kept state of %d messages", state.native, len(origin.state.committed))

        async def prepare():
            return await plan(self.memory_plan(context.policy, origin.state, follower=held, retries=IN_SESSION_RECORD), found.hashes)

        return OnMemory(origin, hold, prepare)

    async def _on_named(self, state: SessionState, policy: str, strict: bool, plan, starts_over):
        """The turn on a named session's own memory (see ``hold_named``); it keeps the state before its commit."""
        try:
            if not starts_over(state):
                return await plan(self.memory_plan(policy, state, keep_parent=True, retries=IN_SESSION_RECORD))
        except ProxyError as exc:
            if exc.code != "transcript_diverged" or strict:
                raise
        await self.sessions.placement.lease_of(state)
        await self.sessions.keep_parent(state)
        await self.sessions.writes.reset(state, await self.sessions.placement.lease_of(state))
        return await plan(self.memory_plan(policy, state, keep_parent=True, retries=IN_SESSION_RECORD))

    # ---- answer: the one entry

    async def run(self, on: OnMemory, answerer: Answerer, *, stream: bool, create: bool = False):
        """Answer where a hold said (``on``) with the surface's ``answerer``: the kept answer replayed; the turn prepared
        on the held session (``answer``); or the turn made already, on a started session or none, whatever ``on.hold``
        holds let go when it is answered (``handed``). ``create``: a new session is created beside its (non-streamed)
        answer."""
        if on.replay is not None:
            return answerer.replayed(on.replay)
        if on.prepare is not None:
            return await self.answer(on.held, on.hold, on.prepare, answerer, stream=stream, create=create)
        answer = self.handed(on.turn, on.held, on.hold, answerer, stream=stream)
        return answer if stream else await answer

    async def answer(self, held: HeldSession, hold: contextlib.AsyncExitStack, prepare: Callable[[], Awaitable[Any]], answerer: Answerer, *,
                     stream: bool, create: bool = False):
        """Answer on a held session with the turn ``prepare()`` makes — before the native session exists, so a refused
        request creates nothing — as a body or, streamed, as events. ``create``: a new session is created beside its
        (non-streamed) answer (``HeldSession.start``)."""
        handed_off = False
        try:
            state = held.state
            turn = await prepare()
            missing, assumed = not state.exists, list(state.committed)
            await held.start(with_answer=True, create=create and not stream)
            # adopted holding memory already, or created empty where the turn assumed memory held some of the transcript
            # (e.g. after an upstream restart): the turn is prepared again on what memory holds
            if missing and state.exists and (not state.blank or state.committed != assumed):
                turn = await prepare()
            if stream:
                handed_off = True
                return self.handed(turn, held, hold, answerer, stream=True)
            try:
                return await answerer.answer(turn, held)
            except MemoryFound:  # the same, found only once the answer was under way
                return await answerer.answer(await prepare(), held)
        finally:
            if not handed_off:
                await hold.aclose()

    def handed(self, turn, held: HeldSession | None, hold: contextlib.AsyncExitStack | None, answerer: Answerer, *, stream: bool):
        """The answer of a turn on a started session (or none), which ``hold`` (if any) lets go when it ends: a stream
        (let go by the stream, or if it is not started in time) or an awaitable of the body."""
        if stream:
            start = StreamStart()
            if hold is not None:
                asyncio.get_running_loop().call_later(STREAM_START_TIMEOUT, self._unstarted, start, hold)
            return self.streaming(start, hold, answerer.events(turn, held))

        async def answered():
            try:
                return await answerer.answer(turn, held)
            finally:
                if hold is not None:
                    await hold.aclose()
        return answered()

    async def streaming(self, start: StreamStart, hold: contextlib.AsyncExitStack | None, events: AsyncIterator) -> AsyncIterator:
        """``events``, a stream's bodies; the held session (if any) is let go when the stream ends, however it ends."""
        if start.begun:  # too late: the session was already let go
            raise Unavailable("the stream was not consumed in time", code="stream_expired")
        start.begun = True
        try:
            async for event in events:
                yield event
        finally:
            if hold is not None:  # the client may have gone away: let the session go in a task of its own
                asyncio.get_running_loop().create_task(hold.aclose())

    def _unstarted(self, start: StreamStart, hold: contextlib.AsyncExitStack) -> None:
        """A stream the server never started (client gone before the response): let its session go."""
        if not start.begun:
            start.begun = True
            asyncio.get_running_loop().create_task(hold.aclose())

    # ---- generate

    async def generate(self, turn: Turn, held: HeldSession | None, sampling: dict | None = None) -> dict:
        """The native answer body: reading the held session's memory, or a plain generation."""
        prompt, sampling = turn.prompt, turn.prompt.sampling if sampling is None else sampling
        return await (self.sessions.upstream.generate(prompt.ids, sampling) if held is None else held.query(prompt.ids, sampling))

    def generate_stream(self, turn: Turn, held: HeldSession | None, sampling: dict | None = None) -> AsyncIterator[dict]:
        """``generate`` as cumulative stream bodies."""
        prompt, sampling = turn.prompt, turn.prompt.sampling if sampling is None else sampling
        return self.sessions.upstream.generate_stream(prompt.ids, sampling) if held is None else held.query_stream(prompt.ids, sampling)

    # ---- after the answer

    def after(self, turn: Turn, held: HeldSession | None, answer: list[dict], output_ids: list[int], finish: str, *,
              kept: str | None = None, answered: dict | None = None) -> int | None:
        """Memory after an answer (``finish``: "stop", "length" or "tool_calls"; ``answer``: its messages; ``kept``: its
        text as the app received it, ``reply_ids``) and the answer kept for a client's retry (``answered``: what the
        surface replays) where the turn's memory plan says (``MemoryPlan.retries``). Returns the memory version a commit
        behind the answer publishes, or None."""
        prompt, memory = turn.prompt, turn.memory
        retries = memory.retries if answered is not None else None
        if retries is not None:
            retries.answered(turn.context, answered)
        if memory.headerless is not None:
            self._fork_next(turn, held, answer, output_ids, finish, kept)
            return None
        if held is None:
            return None
        state = held.state
        if finish == "tool_calls":
            if memory.follower is None:  # a fork's tool round forks again with its results
                hashes = [message_hash(m) for m in prompt.turn + answer]
                self.sessions.writes.set_pending(state, PendingTurn(hashes, prompt.turn_ids + output_ids, prompt.thinking))
            return None
        if memory.policy != "auto" or finish != "stop":
            self.sessions.writes.set_pending(state, None)  # ended without a commit (read-only, or cut): it stays context
            return None
        context = prompt.context_hashes if prompt.context_hashes is not None else [message_hash(m) for m in prompt.context]
        committed = state.committed + context + [message_hash(m) for m in prompt.turn + answer]
        reply = self.reply_ids(turn, output_ids, kept)
        # committed behind the answer: the app has it first, and the session's next request waits for the commit
        if memory.follower is not None:  # the named session becomes a copy of the state read (version 0), then this turn
            memory.follower.commit_turn_later(prompt.context_ids, prompt.turn_ids + reply, committed, source=state.name)
            target, version = memory.follower.state, 1
        else:
            held.commit_turn_later(prompt.context_ids, prompt.turn_ids + reply, committed, keep_parent=memory.keep_parent)
            self.memory_tokens.wrote(state, len(committed), len(prompt.context_ids) + len(prompt.turn_ids) + len(reply))
            target, version = state, state.version + 1
        if retries is not None:  # e.g. in the session's record with that commit: a retry reaching a restarted proxy gets it too
            retries.committed(turn.context, answered, target, version)
        return version

    def _fork_next(self, turn: Turn, held: HeldSession | None, answer: list[dict], output_ids: list[int], finish: str, kept: str | None) -> None:
        """Header-less: an answer (not a function call) forks the conversation's next state from the one the request
        read, or starts one for a conversation worth keeping (``memt_proxy.session.headerless``)."""
        prompt, memory = turn.prompt, turn.memory
        plan = memory.headerless
        keep = finish in ("stop", "length") and memory.policy == "auto" and (held is not None or plan.worth_keeping)
        reply = closed(self.reply_ids(turn, output_ids, kept), self.chat_format.tokenizer.eos_token_id, finish == "length") if keep else []
        lacking, opening = prompt.context_ids + prompt.turn_ids, memory.opening

        async def ids() -> list[int]:
            return (await opening() if opening is not None else lacking) + reply

        after_answer(self.sessions, plan, answer, parent=held.state if held is not None else None, keep=keep, ids=ids)

    def reply_ids(self, turn: Turn, output_ids: list[int], kept: str | None) -> list[int]:
        """The reply as memory keeps it (``ChatFormat.reply_ids``): the generated ids, or for a reply cut by a stop
        string or cleaned of markup by the parser, the ids of the text the app received (``kept``) and an end token."""
        prefix = turn.prompt.prefix
        if kept is None or not kept.startswith(prefix):  # the forced prefix is already in the turn's ids
            return output_ids
        return self.chat_format.reply_ids(output_ids, self.chat_format.decode(output_ids), kept[len(prefix):])

    def usage(self, turn: Turn, completion_tokens: int) -> None:
        """``on_usage`` for a finished answer (all its choices)."""
        try:
            memory = turn.memory
            self.on_usage(prompt_tokens=len(turn.prompt.ids), completion_tokens=completion_tokens, saved_tokens=memory.saved, memory=memory.state is not None)
        except Exception:
            log.exception("on_usage failed")

    def retried(self, tenant: str, digest: str, retry: bool, key: str | None):
        """The answer kept for this request when it is a client's retry (``retries.retried``), else None."""
        return self.answers.retried(tenant, digest, retry, key)
